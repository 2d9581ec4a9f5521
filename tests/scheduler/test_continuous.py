"""Continuous batching decisions, step by step, with the fake runner."""

from minicb.scheduler.plan import DECODE, PREFILL
from tests.scheduler.fake import fake_step, make_request, new_scheduler


def test_finished_request_leaves_and_waiting_one_joins_next_iteration():
    sched = new_scheduler(max_num_seqs=2)
    for rid, mtok in [(0, 2), (1, 6), (2, 3)]:
        sched.add(make_request(rid, 4, mtok))
    p1 = fake_step(sched)
    assert [d.request_id for d in p1.admitted] == [0, 1]
    assert "slots are taken" in " ".join(p1.notes)
    p2 = fake_step(sched)  # request 0 draws its second token and finishes
    assert [d.request_id for d in p2.finished] == [0]
    p3 = fake_step(sched)  # its slot is refilled at once
    assert [d.request_id for d in p3.admitted] == [2]
    assert {r.request_id: r.phase for r in p3.scheduled} == {1: DECODE, 2: PREFILL}


def test_chunked_prefill_puts_decodes_first_then_chunks_under_the_budget():
    sched = new_scheduler(max_num_batched_tokens=8)
    sched.add(make_request(0, 3, 10))
    fake_step(sched)
    sched.add(make_request(1, 20, 2))
    plan = fake_step(sched)
    assert [(r.request_id, r.phase, r.num_tokens) for r in plan.scheduled] == [
        (0, DECODE, 1),
        (1, PREFILL, 7),
    ]
    assert plan.admitted[0].reason == "admitted: 7-token chunk fits the remaining budget of 7"
    plan = fake_step(sched)
    assert [(r.request_id, r.num_tokens, r.samples) for r in plan.scheduled] == [
        (0, 1, True),
        (1, 7, False),
    ]
    plan = fake_step(sched)
    assert [(r.request_id, r.num_tokens, r.samples) for r in plan.scheduled] == [
        (0, 1, True),
        (1, 6, True),
    ]


def test_without_chunking_whole_prompts_run_alone_first():
    sched = new_scheduler(enable_chunked_prefill=False, max_num_batched_tokens=64)
    sched.add(make_request(0, 5, 10))
    fake_step(sched)
    sched.add(make_request(1, 30, 2))
    plan = fake_step(sched)
    assert [(r.request_id, r.num_tokens) for r in plan.scheduled] == [(1, 30)]
    assert "whole prompts only" in plan.notes[0]


def test_preemption_by_recompute_picks_the_latest_arrival_and_explains():
    sched = new_scheduler(num_blocks=4, block_size=4)
    sched.add(make_request(0, 4, 8))
    sched.add(make_request(1, 4, 8))
    fake_step(sched)  # both prefilled: 1 block each, 2 free
    plans = [fake_step(sched) for _ in range(6)]
    preempted = [d for p in plans for d in p.preempted]
    assert preempted and preempted[0].request_id == 1 and preempted[0].mode == "recompute"
    assert "victim is the latest arrival" in preempted[0].reason
    assert sched.requests[1].num_computed_tokens == 0 or sched.requests[1] in sched.running


def test_preemption_by_swap_copies_blocks_out_and_back():
    sched = new_scheduler(num_blocks=4, block_size=4, preemption_mode="swap", num_swap_blocks=8)
    sched.add(make_request(0, 4, 8))
    sched.add(make_request(1, 4, 8))
    plans = [fake_step(sched) for _ in range(30) if sched.has_unfinished()]
    outs = [p for p in plans if p.swap_out_map]
    ins = [p for p in plans if p.swap_in_map]
    assert outs and ins
    assert outs[0].swapped_out[0].request_id == 1
    assert sorted(g for _, g in ins[0].swap_in_map)  # copied back into device blocks
    assert sched.blocks.num_used_blocks == 0 and sched.blocks.num_swapped_blocks == 0


def test_plan_records_budget_slots_and_kv():
    sched = new_scheduler(num_blocks=10, block_size=4, max_num_seqs=3, max_num_batched_tokens=50)
    sched.add(make_request(0, 9, 3))
    plan = fake_step(sched)
    assert (plan.budget_used, plan.budget_limit, plan.slots_used, plan.slots_limit) == (9, 50, 1, 3)
    assert (plan.kv_used, plan.kv_free, plan.kv_total) == (3, 7, 10)
    assert plan.explain()[0].startswith("request 0 admitted: 9-token prompt")
