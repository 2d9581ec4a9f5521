"""Replicas and prefill/decode roles as Ray actors (minicb/fleet/ray/, issue 56), on a
two-node Ray cluster on loopback, on the tiny random model.

One cluster for the module (``ray.cluster_utils.Cluster``: a head node holding the custom
resource "prefill" and a second node holding "decode", everything on 127.0.0.1 with
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, token authentication on with a token made for the
run), shut down in the fixture's finaliser. In file order:

- two replicas spread over the two nodes give the greedy tokens of the in-process fleet
  (and of one engine); a Ray actor passes the one replica contract of
  tests/test_engine_like.py (its checks, called here);
- a prefill engine on the "prefill" node and a decode engine on the "decode" node hand
  the KV over through Ray's object store, token-identical to one engine, with its bytes
  and seconds measured; roles the cluster cannot place are refused by name; the prefill
  engine's actor killed mid-hand-off ends the request with an error naming it, and the
  decode side's blocks are freed;
- killing one replica's actor mid-request ends that replica's requests with an error
  naming it and Ray's cause, within a bound; the other replica's requests finish with the
  same tokens; the router takes it out of rotation and the fleet keeps serving;
- ``minicb serve --replicas 2 --fleet ray``: the API's replies are one engine's tokens, and
  a killed actor is replaced by a fresh one, which serves again;
- last: the second node removed mid-request: its replica's request ends with an error, the
  head node's replica finishes and serves on.

Opt-in (marker ``ray``, and ``slow``: make test-slow, make test-all), skipped when ray is
not installed (pip install 'minicb[ray]'); every wait is bounded. 160 s here at load
average 11 on the shared two cores (69 s of it the module's set-up).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import sys
import threading
import time

import pytest

from minicb.core.config import SamplingParams
from minicb.core.engine_like import SteppedEngine
from minicb.core.request import RequestOutput
from minicb.fleet.fleet import FLEET, Fleet
from tests import test_engine_like as contract
from tests.helpers import MIXED, MIXED_MAX, wait_for
from tests.test_engine_like import members

if importlib.util.find_spec("ray") is None:
    pytest.skip("no ray: pip install 'minicb[ray]'", allow_module_level=True)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

OPTIONS = dict(dtype="float32", device="cpu", block_size=16, num_kv_blocks=64, max_num_seqs=8)
PROMPTS, MAX_TOKENS = MIXED[:6], MIXED_MAX[:6]
DEATH_BOUND_S = 15.0  # a killed actor's requests end within this
RUN_BOUND_S = 120.0  # any one generate or scenario here


def greedy(max_tokens: list[int]) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]


@pytest.fixture(scope="module")
def reference(mixed_reference):
    return mixed_reference[:6]


@pytest.fixture(scope="module")
def cluster():
    # Ray reads RAY_AUTH_MODE when it is first imported: so here, after the env is set
    assert "ray" not in sys.modules, "ray was imported before the cluster's settings"
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # one host: every address 127.0.0.1
        "RAY_AUTH_MODE": "token",  # both sides must present the token
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_USAGE_STATS_ENABLED": "0",  # nothing leaves the machine
    }
    saved = {k: os.environ.get(k) for k in (*env, "RAY_ADDRESS")}
    os.environ.update(env)
    import ray
    from ray.cluster_utils import Cluster

    # no dashboard: the head starts lighter (Ray gives a node 30 s to start, which a loaded
    # machine can miss)
    # 4 logical CPUs a node (Ray's bookkeeping, not cores): every actor the module keeps at
    # once fits (an actor takes 1), whichever node it is put on
    head = {"num_cpus": 4, "resources": {"prefill": 1}, "include_dashboard": False}
    made = Cluster(initialize_head=True, head_node_args=head)
    try:
        made.add_node(num_cpus=4, resources={"decode": 1})
        made.wait_for_nodes(timeout=60)
        ray.init(address=made.address, configure_logging=False)
        yield made
    finally:
        ray.shutdown()
        made.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def node_holding(resource: str) -> str:
    import ray

    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"])


@pytest.fixture(scope="module")
def ray_fleet(cluster, tiny_llama_dir):
    from minicb.fleet.ray.ray_fleet import RayFleet

    # not restarted: the kill test checks that the survivor takes every request after it
    with RayFleet(
        tiny_llama_dir, replicas=2, threads=1, restart_replicas=False, **OPTIONS
    ) as fleet:
        yield fleet


def test_replicas_on_two_nodes_give_the_in_process_fleets_greedy_tokens(
    ray_fleet, tiny_llama_dir, reference
):
    nodes = {r.node_id() for r in ray_fleet.replicas.values()}
    assert len(nodes) == 2, "one replica on each node, in turn"
    outs = ray_fleet.generate(PROMPTS, greedy(MAX_TOKENS))
    with Fleet(tiny_llama_dir, replicas=2, threads=1, **OPTIONS) as local:
        in_process = local.generate(PROMPTS, greedy(MAX_TOKENS))
    assert [o.token_ids for o in outs] == [o.token_ids for o in in_process] == reference
    assert [o.finish_reason for o in outs] == ["length"] * len(PROMPTS)


# The one replica contract (tests/test_engine_like.py), run on a Ray actor: the same checks
# as on an engine in this process, a replica process and a simulated replica.
greedy_reference = contract.greedy_reference  # its fixture, here too


@pytest.fixture(scope="module")
def ray_replica(cluster, tiny_llama_dir):
    from minicb.core.config import EngineConfig
    from minicb.fleet.ray.ray_fleet import RayReplica

    config = EngineConfig.from_kwargs(**contract.CONTRACT)
    replica = RayReplica(0, tiny_llama_dir, config, threads=1).ready()
    try:
        yield "ray-actor", replica, True  # its tokens are the model's
    finally:
        replica.close()


def test_contract_on_a_ray_actor_requests_run_to_their_end(ray_replica, greedy_reference):
    assert [n for n in members(SteppedEngine) if not hasattr(ray_replica[1], n)] == []
    contract.test_contract_requests_run_to_their_end_and_free_their_blocks(
        ray_replica, greedy_reference
    )


def test_contract_on_a_ray_actor_an_abort_frees_the_request_at_once(ray_replica):
    contract.test_contract_an_abort_frees_the_request_at_once(ray_replica)


def test_contract_on_a_ray_actor_a_prompt_that_can_never_fit_is_refused(ray_replica):
    contract.test_contract_a_prompt_that_can_never_fit_is_refused(ray_replica)


@pytest.fixture(scope="module")
def pd_fleet(cluster, tiny_llama_dir):
    from minicb.fleet.ray.ray_disagg import RayDisaggregatedFleet

    with RayDisaggregatedFleet(
        tiny_llama_dir, prefill=1, decode=1, transfer_timeout_s=30.0, **OPTIONS
    ) as fleet:
        yield fleet


def test_prefill_and_decode_on_their_nodes_hand_the_kv_through_the_object_store(
    pd_fleet, reference
):
    fleet = pd_fleet
    assert fleet.engines["prefill0"].node_id() == node_holding("prefill")
    assert fleet.engines["decode0"].node_id() == node_holding("decode")
    assert fleet.engines["prefill0"].node_id() != fleet.engines["decode0"].node_id()
    outs = fleet.generate(PROMPTS, greedy(MAX_TOKENS))
    assert [o.token_ids for o in outs] == reference
    assert [o.error for o in outs] == [None] * len(PROMPTS)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.transfer["blocks"] == -(-len(prompt) // OPTIONS["block_size"])
        assert out.transfer["bytes"] > 0 and out.transfer["seconds"] > 0
    total = sum(o.transfer["bytes"] for o in outs)
    print(f"object store hand-offs: {total} bytes in {len(outs)} transfers, "
          f"{[round(o.transfer['seconds'] * 1e3, 1) for o in outs]} ms")  # fmt: skip
    assert fleet.kv_used() == {"prefill0": 0, "decode0": 0}


def test_roles_the_cluster_cannot_place_are_refused_by_name(cluster, tiny_llama_dir):
    from minicb.fleet.ray.ray_disagg import RayDisaggregatedFleet

    with pytest.raises(ValueError, match="2 prefill engines need 2 units of the custom resource"):
        RayDisaggregatedFleet(tiny_llama_dir, prefill=2, decode=1, **OPTIONS)


def test_a_prefill_engine_killed_mid_hand_off_is_reported_and_frees_the_decode_side(pd_fleet):
    """It kills the prefill engine's actor: after the test above. The prefill engine pauses
    1 s after each layer it posts (the fleet's test hook); the kill lands 0.5 s after the
    fleet began the send, between the first layer and the second."""
    import ray

    fleet = pd_fleet
    prefill = fleet.engines["prefill0"]
    fleet.handoffs.send_delay_s = 1.0
    sent: list[float] = []

    def kill_mid_transfer() -> None:
        deadline = time.monotonic() + DEATH_BOUND_S
        while time.monotonic() < deadline:
            if any(j.state == "receiving" for j in list(fleet.journeys.values())):
                sent.append(time.monotonic())
                time.sleep(0.5)
                ray.kill(prefill.child.process.actor, no_restart=True)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_mid_transfer, daemon=True)
    killer.start()
    start = time.monotonic()
    outs = fleet.generate(PROMPTS[:1], greedy([8]), timeout_s=RUN_BOUND_S)
    elapsed = time.monotonic() - start
    killer.join(5)
    assert sent, "the transfer never started"
    assert elapsed < DEATH_BOUND_S + 5.0
    assert outs[0].finish_reason == "error"
    assert "prefill0" in outs[0].error and "killed by `ray.kill`" in outs[0].error, outs[0].error
    wait_for(lambda: fleet.kv_used() == {"decode0": 0}, timeout=DEATH_BOUND_S)


def test_a_killed_actor_ends_its_requests_with_an_error_and_the_fleet_goes_on(
    ray_fleet, reference
):
    import ray

    ray_fleet.set_policy("round-robin")  # prompts 0, 2, 4 to replica0; 1, 3, 5 to replica1
    loop = ray_fleet.engine_loop()
    victim = ray_fleet.replicas["replica1"]
    params = greedy(MAX_TOKENS)
    long = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

    async def run() -> tuple[list[RequestOutput], float]:
        streams = [
            await loop.submit(FLEET, p, params[i] if i % 2 == 0 else long)
            for i, p in enumerate(PROMPTS)
        ]
        assert [s.engine for s in streams] == ["replica0", "replica1"] * 3
        async for _token in streams[1]:  # the victim is mid-run: it has sent a token
            break
        ray.kill(victim.child.process.actor, no_restart=True)
        killed = time.monotonic()
        outs, ends = [], []
        for stream in streams:
            async for item in stream:
                if isinstance(item, RequestOutput):
                    outs.append(item)
                    if stream.engine == "replica1":
                        ends.append(time.monotonic() - killed)
        return outs, max(ends)

    outs, ended_after = asyncio.run(asyncio.wait_for(run(), RUN_BOUND_S))
    assert ended_after < DEATH_BOUND_S
    for out in outs[1::2]:
        assert out.finish_reason == "error"
        assert "replica1" in out.text and "killed by `ray.kill`" in out.text, out.text
    assert [o.token_ids for o in outs[0::2]] == reference[0::2]  # none of the others lost
    assert 1 in ray_fleet.router.removed
    assert ray_fleet.health()["replica1"] != "ok"
    # the fleet goes on: every new request goes to the survivor, with the same tokens
    seen: list = []
    ray_fleet.bus.subscribe(seen.extend, kinds=["routed"])
    again = ray_fleet.generate(PROMPTS[:2], greedy(MAX_TOKENS[:2]))
    assert [o.token_ids for o in again] == reference[:2]
    assert [e.replica for e in seen] == [0, 0]


def test_serve_fleet_ray_answers_through_the_api_and_restarts_a_killed_replica(
    cluster, tiny_llama_dir, reference
):
    """``minicb serve --replicas 2 --fleet ray``: the API's replies are one engine's tokens,
    /health names the replicas; a killed actor is out of rotation, then a fresh actor takes
    its place and serves (the fleet's restart, placed by Ray)."""
    import httpx
    import ray

    from minicb.cli import build_parser
    from minicb.server.serve_command import build_serve
    from tests.api.live import live_server

    argv = ["serve", "--model", tiny_llama_dir, "--replicas", "2", "--fleet", "ray"]
    argv += ["--dtype", "float32", "--num-kv-blocks", "64", "--no-measure-utilisation"]
    app, loop, fleet, name = build_serve(build_parser().parse_args(argv))
    loop.start()
    try:
        with live_server(app) as url:

            def complete(i: int) -> list[int]:
                body = {"model": name, "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i]}
                body.update(temperature=0, ignore_eos=True, return_token_ids=True)
                reply = httpx.post(url + "/v1/completions", json=body, timeout=60)
                assert reply.status_code == 200, reply.text
                return reply.json()["choices"][0]["token_ids"]

            assert [complete(i) for i in range(4)] == reference[:4]
            assert httpx.get(url + "/health", timeout=10).json()["replicas"] == {
                "replica0": "ok", "replica1": "ok"
            }  # fmt: skip
            victim = fleet.replicas["replica0"]
            first = victim.child.process.actor
            ray.kill(first, no_restart=True)
            wait_for(lambda: victim.restarts == 1, timeout=DEATH_BOUND_S)
            wait_for(lambda: victim.serving, timeout=RUN_BOUND_S)  # its fresh actor is ready
            assert victim.child.process.actor is not first
            assert 0 not in fleet.router.removed  # back in rotation
            assert [complete(i) for i in range(4)] == reference[:4]
    finally:
        fleet.close()  # its loop's thread too


def test_a_node_that_dies_takes_its_replica_out_and_the_other_node_serves(
    cluster, tiny_llama_dir, reference
):
    """Last (it removes the second node): the replica on that node is declared dead, with
    its requests ended by an error naming it, and the replica on the head node serves."""
    from minicb.fleet.ray.ray_fleet import RayFleet

    (worker,) = cluster.worker_nodes
    with RayFleet(
        tiny_llama_dir, replicas=2, threads=1, restart_replicas=False, **OPTIONS
    ) as fleet:
        loop = fleet.engine_loop()
        loop.start()
        on_worker = [r for r in fleet.replicas.values() if r.node_id() == worker.node_id]
        assert len(on_worker) == 1, "one replica on each node, in turn"
        gone = on_worker[0]
        long = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

        async def run() -> list[RequestOutput]:
            streams = [await loop.submit(FLEET, p, long) for p in PROMPTS[:2]]
            doomed = next(s for s in streams if s.engine == gone.name)
            async for _token in doomed:  # it is mid-run on the node about to go
                break
            cluster.remove_node(worker, allow_graceful=False)
            outs = []
            for stream in streams:
                async for item in stream:
                    if isinstance(item, RequestOutput):
                        outs.append((stream.engine, item))
            return outs

        outs = asyncio.run(asyncio.wait_for(run(), RUN_BOUND_S))
        for engine, out in outs:
            if engine == gone.name:
                assert out.finish_reason == "error" and gone.name in out.text, out.text
            else:
                assert out.finish_reason == "length" and len(out.token_ids) == 400
        assert gone.index in fleet.router.removed
        again = fleet.generate(PROMPTS[:2], greedy(MAX_TOKENS[:2]))
        assert [o.token_ids for o in again] == reference[:2]
