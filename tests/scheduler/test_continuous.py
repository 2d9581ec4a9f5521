"""Continuous batching decisions, step by step, on the real engine over FakeRunner."""

from minicb.core.request import RequestStatus
from minicb.core.scheduler.plan import DECODE, PREFILL
from tests.helpers import add, fake_engine


def test_finished_request_leaves_and_waiting_one_joins_next_iteration():
    engine = fake_engine(max_num_seqs=2)
    for mtok in (2, 6, 3):
        add(engine, 4, mtok)
    p1 = engine.step().plan
    assert [d.request_id for d in p1.admitted] == [0, 1]
    assert "slots are taken" in " ".join(p1.notes)
    p2 = engine.step().plan  # request 0 draws its second token and finishes
    assert [d.request_id for d in p2.finished] == [0]
    p3 = engine.step().plan  # its slot is refilled at once
    assert [d.request_id for d in p3.admitted] == [2]
    assert {r.request_id: r.phase for r in p3.scheduled} == {1: DECODE, 2: PREFILL}


def test_a_full_batch_says_so_without_sorting_its_queue(monkeypatch):
    """The waiting queue (thousands deep in a simulated demo) is ordered only when a slot
    and some budget are free: a full batch admits nobody, and sorting for nothing was most
    of schedule()'s time at 10,000 waiting (docs/performance.md, host)."""
    engine = fake_engine(max_num_seqs=2)
    for _ in range(6):
        add(engine, 4, 8)
    sorted_queues = []
    ordered = engine.scheduler.ordered
    monkeypatch.setattr(
        engine.scheduler, "ordered", lambda q: sorted_queues.append(len(q)) or ordered(q)
    )
    first = engine.step().plan  # two slots free: the queue of six is sorted, two admitted
    assert [d.request_id for d in first.admitted] == [0, 1] and 6 in sorted_queues
    sorted_queues.clear()
    full = engine.step().plan  # both slots taken: the four waiting are not even sorted
    assert not full.admitted and "4 waiting: all 2 slots are taken" in full.notes
    assert 4 not in sorted_queues  # (the running pair is still ordered for its decodes)


def test_chunked_prefill_puts_decodes_first_then_chunks_under_the_budget():
    engine = fake_engine(max_num_batched_tokens=8)
    add(engine, 3, 10)
    engine.step()
    add(engine, 20, 2)
    plan = engine.step().plan
    assert [(r.request_id, r.phase, r.num_tokens) for r in plan.scheduled] == [
        (0, DECODE, 1),
        (1, PREFILL, 7),
    ]
    assert plan.admitted[0].reason == "admitted: 7-token chunk fits the remaining budget of 7"
    plan = engine.step().plan
    assert [(r.request_id, r.num_tokens, r.samples) for r in plan.scheduled] == [
        (0, 1, True),
        (1, 7, False),
    ]
    plan = engine.step().plan
    assert [(r.request_id, r.num_tokens, r.samples) for r in plan.scheduled] == [
        (0, 1, True),
        (1, 6, True),
    ]


def test_without_chunking_whole_prompts_run_alone_first():
    engine = fake_engine(enable_chunked_prefill=False, max_num_batched_tokens=64)
    add(engine, 5, 10)
    engine.step()
    add(engine, 30, 2)
    plan = engine.step().plan
    assert [(r.request_id, r.num_tokens) for r in plan.scheduled] == [(1, 30)]
    assert "whole prompts only" in plan.notes[0]


def test_preemption_by_recompute_picks_the_latest_arrival_and_explains():
    engine = fake_engine(num_kv_blocks=4, block_size=4)
    add(engine, 4, 8)
    add(engine, 4, 8)
    engine.step()  # both prefilled: 1 block each, 2 free
    plans = [engine.step().plan]
    while not plans[-1].preempted:
        assert len(plans) < 6, "nobody was preempted"
        plans.append(engine.step().plan)
    preempted = plans[-1].preempted
    assert [(d.request_id, d.mode) for d in preempted] == [(1, "recompute")]
    assert "victim is the latest arrival" in preempted[0].reason
    sched = engine.scheduler  # the scheduler's own bookkeeping of the victim, right after
    victim = sched.requests[1]
    assert victim.num_computed_tokens == 0 and sched.waiting == [victim]
    assert victim.status == RequestStatus.WAITING and not sched.blocks.block_table(1)


def test_preemption_by_swap_copies_blocks_out_and_back():
    engine = fake_engine(num_kv_blocks=4, block_size=4, preemption_mode="swap", num_swap_blocks=8)
    add(engine, 4, 8)
    add(engine, 4, 8)
    plans = [engine.step().plan for _ in range(30) if engine.has_unfinished()]
    outs = [p for p in plans if p.swap_out_map]
    ins = [p for p in plans if p.swap_in_map]
    assert outs and ins
    assert outs[0].swapped_out[0].request_id == 1
    # the CPU copies made on the way out are the ones copied back, into distinct blocks
    assert [cpu for cpu, _ in ins[0].swap_in_map] == [cpu for _, cpu in outs[0].swap_out_map]
    device = [d for _, d in ins[0].swap_in_map]
    assert len(set(device)) == len(device) and set(device) <= set(range(4))
    kv = engine.kv_snapshot()
    assert kv.num_used == 0 and kv.num_swapped == 0


def test_plan_records_budget_slots_and_kv():
    engine = fake_engine(num_kv_blocks=10, block_size=4, max_num_seqs=3, max_num_batched_tokens=50)
    add(engine, 9, 3)
    plan = engine.step().plan
    assert (plan.budget_used, plan.budget_limit, plan.slots_used, plan.slots_limit) == (9, 50, 1, 3)
    assert (plan.kv_used, plan.kv_free, plan.kv_total) == (3, 7, 10)
    assert plan.explain()[0].startswith("request 0 admitted: 9-token prompt")
