"""The precise router on two real replica processes of the tiny model: their KV events
cross the pipe into the router's index, greedy tokens are the same under every router, a
lost record is found and the index resyncs from a snapshot the replica sends over the
pipe, and a replica killed and restarted is indexed afresh. One fleet for the module."""

from __future__ import annotations

import os
import signal

import pytest

from minicb import LLM, SamplingParams
from minicb.fleet import Fleet
from minicb.fleet.kv_events import block_keys
from minicb.fleet.router import POLICIES
from tests.helpers import wait_for

# Its module fixture starts two replica processes: seconds before the first test.
pytestmark = pytest.mark.slow

DOC = [(7 * i) % 200 + 3 for i in range(64)]  # a 4-block shared prefix
PROMPTS = [DOC + [5, 6, 7], [9, 10, 11] * 10, DOC + [40] * 20, [12] * 40]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
OPTIONS = dict(dtype="float32", num_kv_blocks=32)


@pytest.fixture(scope="module")
def expected(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, **OPTIONS)
    return [out.token_ids for out in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def fleet(tiny_llama_dir):
    with Fleet(tiny_llama_dir, replicas=2, router="precise-prefix", threads=1, **OPTIONS) as f:
        yield f


def heard(fleet: Fleet, predicate) -> None:
    """Wait until the index, fed what the replicas sent, makes ``predicate`` true."""

    def check() -> bool:
        fleet._hear_kv_events()
        return bool(predicate())

    wait_for(check)


def holder_of(fleet: Fleet, prompt: list[int]) -> dict[int, int]:
    keys = block_keys(prompt, fleet.config.block_size)
    return {i: fleet.router.index.matched(i, keys) for i in fleet._by_index}


def test_greedy_tokens_are_the_same_under_every_router(fleet, expected):
    for policy in POLICIES:
        fleet.set_policy(policy)
        outs = fleet.generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == expected, policy
    fleet.set_policy("precise-prefix")


def test_the_index_learns_what_a_replica_holds_and_the_router_follows_it(fleet):
    fleet.generate([DOC + [1, 2, 3]], GREEDY)
    heard(fleet, lambda: max(holder_of(fleet, DOC).values()) == 4)
    home = max(holder_of(fleet, DOC).items(), key=lambda kv: kv[1])[0]
    route = fleet.router.route(-1, DOC + [4, 4], fleet.loads())
    assert route.replica == home and route.cached_tokens == 64
    assert f"replica {home} held 4 of 4 blocks" in route.reason


def test_a_lost_record_is_found_and_the_replica_resends_all_it_holds(fleet):
    index = fleet.router.index
    resyncs = index.resyncs
    fleet.generate([[21] * 48], GREEDY)  # some new blocks somewhere
    links = {i: r.child.link for i, r in fleet._by_index.items()}
    wait_for(lambda: any(not link.kv_events.empty() for link in links.values()))
    lost = next(i for i, link in links.items() if not link.kv_events.empty())
    while not links[lost].kv_events.empty():
        links[lost].kv_events.get_nowait()  # lost on the way
    fleet.generate([[22] * 48, [23] * 48, [24] * 48, [25] * 48], GREEDY)  # more records
    heard(fleet, lambda: index.resyncs > resyncs and not index.resyncing([lost]))
    before = set(index.streams[lost].keys)
    # after the snapshot the stream goes on, and it was right: DOC is still indexed where held
    assert before and max(holder_of(fleet, DOC).values()) == 4


def test_a_restarted_replica_is_indexed_afresh(fleet):
    replica = fleet._by_index[0]
    os.kill(replica.process.pid, signal.SIGKILL)
    fleet.generate([[30] * 20], GREEDY)  # the loop's turns find the death and restart it
    wait_for(lambda: replica.restarts == 1 and replica.serving, timeout=120)
    index = fleet.router.index
    assert index.held(0) == 0  # dropped at its death: a fresh process holds nothing
    outs = fleet.generate([DOC + [8, 8], [31] * 40], GREEDY)
    assert all(o.finish_reason == "length" for o in outs)
    heard(fleet, lambda: index.held(0) > 0 or index.held(1) > 0)
    assert not index.resyncing([0, 1])
