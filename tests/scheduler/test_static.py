"""The static-batching baseline: nobody joins mid-batch; finished members pad until the end."""

from minicb.core.scheduler.plan import PADDING
from tests.helpers import add, fake_engine


def test_nobody_is_admitted_mid_batch_and_padding_is_computed():
    engine = fake_engine(batching="static", max_num_seqs=2)
    add(engine, 3, 2)
    add(engine, 3, 5)
    add(engine, 3, 2)
    plans = []
    while engine.has_unfinished():
        plans.append(engine.step().plan)
    admitted = [[d.request_id for d in p.admitted] for p in plans]
    assert admitted[0] == [0, 1]
    first_batch_end = next(i for i, p in enumerate(plans) if p.finished)
    assert all(not a for a in admitted[1 : first_batch_end + 1])
    assert admitted[first_batch_end + 1] == [2]
    # Request 0 stopped after 2 tokens but stayed in the batch as padding until 1 finished.
    padding = [
        (i, r.request_id) for i, p in enumerate(plans) for r in p.scheduled if r.phase == PADDING
    ]
    assert [rid for _, rid in padding] == [0, 0, 0]
    assert {d.request_id for d in plans[first_batch_end].finished} == {0, 1}
    assert all(
        "waiting: a static batch admits nobody" in " ".join(p.notes)
        for p in plans[1:first_batch_end]
    )


def test_static_batch_reserves_blocks_for_the_whole_request():
    engine = fake_engine(batching="static", num_kv_blocks=6, block_size=4)
    add(engine, 4, 12)  # 16 tokens: 4 blocks
    add(engine, 4, 12)
    plan = engine.step().plan
    assert [d.request_id for d in plan.admitted] == [0]
    assert plan.kv_used == 4
    assert "would reserve 4 blocks, 2 free" in plan.notes[0]


def _run_static(order: str, lengths: list[int]) -> tuple[list, dict[int, list[int]]]:
    engine = fake_engine(batching="static", max_num_seqs=2, static_order=order)
    for max_tokens in lengths:
        add(engine, 2, max_tokens)
    plans, tokens = [], {}
    while engine.has_unfinished():
        result = engine.step()
        plans.append(result.plan)
        tokens |= {out.request_id: out.token_ids for out in result.finished}
    return plans, tokens


def test_length_order_batches_similar_lengths_and_keeps_the_tokens():
    lengths = [20, 3, 19, 4]  # arrival order pairs a long with a short request twice
    by_arrival, arrival_tokens = _run_static("arrival", lengths)
    by_length, length_tokens = _run_static("length", lengths)
    batches = [sorted(d.request_id for d in p.admitted) for p in by_length if p.admitted]
    assert batches == [[1, 3], [0, 2]]  # shortest first, then the two long ones

    def padding(plans):
        return sum(r.phase == PADDING for p in plans for r in p.scheduled)

    assert padding(by_length) < padding(by_arrival)
    assert len(by_length) < len(by_arrival)  # fewer iterations for the same work
    assert length_tokens == arrival_tokens
