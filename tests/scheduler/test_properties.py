"""Property tests (hypothesis) of the schedulers, on the real engine over FakeRunner.

Random arrivals, lengths, priorities and aborts must never exceed a limit, never leak or
double-own a KV block, finish every request, keep FCFS order under ``fcfs``, and bound
the longest wait under ``priority``. Every rejection must be justified by the limit its
message names, and every request that breaks no limit must be accepted.

The workloads are biased towards memory pressure (small pools, long prompts, mostly
continuous batching with swap space), and the test counts what it reached: most of its
examples must preempt and most must swap, or the promises above were never tested where
they are hardest to keep. Derandomized: the same 1,000 workloads every run, so those counts
cannot fall short by chance.
"""

from collections import Counter

import pytest
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from minicb.core.request import RequestStatus
from minicb.core.scheduler import RequestRejected
from minicb.core.scheduler.block_manager import blocks_needed
from tests.helpers import add, fake_engine

NUM_WORKLOADS = 1000

request_st = st.tuples(
    st.integers(1, 48),  # prompt length
    st.integers(1, 24),  # max_tokens
    st.integers(0, 3),  # priority
    st.integers(0, 4),  # arrival step
    st.booleans(),  # aborted at some point
)

# Weighted choices: static batching never preempts, and recompute never swaps, so each is
# one draw in six; the other draws put the pool under the pressure the test is about.
# Hypothesis favours the first element of a sampled_from, so that is the pressing one.
config_st = st.fixed_dictionaries(
    {
        "batching": st.sampled_from(["continuous"] * 5 + ["static"]),
        "policy": st.sampled_from(["fcfs", "priority"]),
        "max_num_seqs": st.integers(1, 8),
        "max_num_batched_tokens": st.integers(1, 96),
        "block_size": st.sampled_from([1, 4, 16]),
        "enable_chunked_prefill": st.sampled_from([True, True, True, False]),
        "preemption_mode": st.sampled_from(["swap"] * 5 + ["recompute"]),
        "aging_steps": st.integers(1, 8),
    }
)


LIMITS = ("context", "pool", "budget")


def expected_rejection(
    prompt_len: int, max_tokens: int, config: dict, num_blocks: int, max_model_len: int
) -> tuple[str, str] | None:
    """The limit a request breaks (one of LIMITS) and the words its rejection must name it
    by, or None if it breaks none."""
    if prompt_len >= max_model_len:
        return "context", f"does not fit the model's context of {max_model_len} tokens"
    worst = min(prompt_len + max_tokens, max_model_len)
    if blocks_needed(worst, config["block_size"]) > num_blocks:
        return "pool", f"the whole pool holds {num_blocks * config['block_size']}"
    if not config["enable_chunked_prefill"] and worst > config["max_num_batched_tokens"]:
        return "budget", f"max_num_batched_tokens={config['max_num_batched_tokens']}"
    return None


def check_limits(plan, sched, config: dict, num_blocks: int) -> None:
    """One step kept the token budget (static prefills may exceed it), the slots, the pool
    and the block manager's books, and every row's table covers its context."""
    assert plan.num_tokens <= config["max_num_batched_tokens"] or config["batching"] == "static"
    assert len(sched.running) <= config["max_num_seqs"]
    assert plan.kv_used + plan.kv_free == num_blocks
    sched.blocks.check()
    for row in plan.scheduled:
        assert len(row.block_table) * config["block_size"] >= row.context_len


def run_workload(config: dict, num_blocks: int, max_model_len: int, requests: list) -> Counter:
    """Drive one workload to the end, checking every limit at every step; returns what it
    reached (rejections, preemptions, swaps out and in)."""
    engine = fake_engine(num_kv_blocks=num_blocks, max_model_len=max_model_len, **config)
    sched = engine.scheduler  # its running batch and block manager are what is checked
    pending = sorted(enumerate(requests), key=lambda x: x[1][3])
    index_of: dict[int, int] = {}  # engine id -> index in ``requests``
    admitted_order: list[int] = []
    accepted: set[int] = set()
    finished: set[int] = set()
    reached: Counter = Counter()
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1][3] <= step:
            i, (plen, mtok, prio, _, abort) = pending.pop(0)
            why = expected_rejection(plen, mtok, config, num_blocks, max_model_len)
            try:
                rid = add(engine, plen, mtok, prio, arrival=step + i / 100)
            except RequestRejected as err:
                assert why is not None, f"rejected without breaking a limit: {err}"
                assert why[1] in str(err), f"the rejection names another limit than {why}"
                reached["rejected"] += 1
                reached[f"rejected for {why[0]}"] += 1
                continue
            assert why is None, f"accepted a request that breaks the {why[0]} limit"
            index_of[rid] = i
            accepted.add(rid)
            if abort and i % 2:
                engine.abort_request(rid)
                finished.add(rid)
        plan = engine.step().plan
        step += 1
        assert step < 5000, "the scheduler stopped making progress"
        check_limits(plan, sched, config, num_blocks)
        admitted_order += [
            d.request_id for d in plan.admitted if d.request_id not in admitted_order
        ]
        finished.update(d.request_id for d in plan.finished)
        reached["preempted"] += len(plan.preempted)
        reached["swapped_out"] += len(plan.swapped_out)
        reached["swapped_in"] += len(plan.swapped_in)
        # Abort a running request mid-flight now and then.
        if step % 7 == 0 and sched.running:
            victim = sched.running[-1].request_id
            engine.abort_request(victim)
            finished.add(victim)
    assert finished == accepted
    kv = engine.kv_snapshot()
    assert kv.num_used == 0 and kv.num_swapped == 0
    sched.blocks.check()
    if config["policy"] == "fcfs":
        arrivals = {rid: (requests[index_of[rid]][3], index_of[rid]) for rid in admitted_order}
        first_admissions = [arrivals[r] for r in admitted_order]
        assert first_admissions == sorted(first_admissions)
    reached["requests"] += len(requests)
    return reached


@pytest.mark.slow  # hundreds of random workloads: tens of seconds
def test_random_workloads_keep_every_promise():
    """NUM_WORKLOADS random workloads keep every promise; most of them preempt and swap."""
    totals: Counter = Counter()

    @settings(max_examples=NUM_WORKLOADS, deadline=None, database=None, derandomize=True)
    @given(
        config=config_st,
        pool_tokens=st.integers(24, 96),
        swap_ratio=st.sampled_from([2, 1, 4, 0.5, 0]),  # swap space over the device pool
        max_model_len=st.sampled_from([32] + [1024] * 5),
        requests=st.lists(request_st, min_size=4, max_size=14),
    )
    def workload(config, pool_tokens, swap_ratio, max_model_len, requests):
        num_blocks = max(1, pool_tokens // config["block_size"])
        config = {**config, "num_swap_blocks": int(num_blocks * swap_ratio)}
        reached = run_workload(config, num_blocks, max_model_len, requests)
        target(float(reached["preempted"] + reached["swapped_out"]), label="preemptions")
        totals["examples"] += 1
        totals["requests"] += reached["requests"]
        for what in ("rejected", *(f"rejected for {limit}" for limit in LIMITS)):
            totals[what] += reached[what]
        if reached["rejected"] == reached["requests"]:
            totals["examples all rejected"] += 1
        for what in ("rejected", "preempted", "swapped_out", "swapped_in"):
            if reached[what]:
                event(what)
                totals[f"examples {what}"] += 1

    workload()
    n = totals["examples"]
    assert n >= NUM_WORKLOADS
    # The bias works: most examples reach preemption and a swap, and come back from it.
    assert totals["examples preempted"] > n / 2, totals
    assert totals["examples swapped_out"] > n / 2, totals
    assert totals["examples swapped_in"] > n / 2, totals
    # Rejections are tested, but most requests are served, and few examples serve none.
    assert totals["examples rejected"] > 0, totals
    assert totals["examples all rejected"] < n / 10, totals
    # Each of the three limits was the reason for some rejection.
    assert all(totals[f"rejected for {limit}"] for limit in LIMITS), totals
    assert totals["rejected"] < totals["requests"] / 2, totals


@settings(max_examples=40, deadline=None)
@given(aging=st.integers(1, 6), low_priority=st.integers(1, 4))
def test_priority_aging_bounds_the_longest_wait(aging, low_priority):
    """A low-priority request waits a bounded number of steps under a stream of urgent ones."""
    engine = fake_engine(policy="priority", aging_steps=aging, max_num_seqs=1)
    add(engine, 4, 2, priority=low_priority, arrival=0.0)
    admitted_at = None
    for step in range(400):
        add(engine, 4, 2, priority=0, arrival=float(step) + 0.5)  # a newcomer every step
        plan = engine.step().plan
        if any(d.request_id == 0 for d in plan.admitted):
            admitted_at = step
            break
    # Effective priority drops one level per `aging` steps; then it waits behind at most the
    # newcomers that arrived earlier and still rank equal, each of which holds the slot ~3 steps.
    bound = (low_priority + 1) * aging * 4 + 8
    assert admitted_at is not None and admitted_at <= bound


def test_fcfs_request_would_starve_without_aging_under_priority_policy_with_huge_aging():
    """Control for the test above: with aging effectively off, the low-priority request waits."""
    engine = fake_engine(policy="priority", aging_steps=10_000, max_num_seqs=1)
    add(engine, 4, 2, priority=3, arrival=0.0)
    for step in range(100):
        add(engine, 4, 2, priority=0, arrival=step + 0.5)
        engine.step()
    assert engine.scheduler.requests[0].status == RequestStatus.WAITING
