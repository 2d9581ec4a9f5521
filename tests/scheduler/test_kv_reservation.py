"""KV reservation modes (paged, max, pow2, oracle) in the continuous scheduler, on the real
engine over FakeRunner: what admission reserves and says, that a right hint never grows,
that a short one grows paged and says so, that reserving more batches fewer requests, that
preemption frees a reservation, and that random workloads never leak a block.
"""

import argparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.scheduler import RequestRejected
from minicb.engine_options import add_engine_options, engine_kwargs
from minicb.telemetry.kv_state import KVState
from tests.helpers import fake_engine

MODES = ["paged", "max", "pow2", "oracle"]


def _add(engine, prompt_len, max_tokens, hint=None, token=5):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return engine.add_request([token] * prompt_len, params, expected_output_tokens=hint)


def _run(engine) -> list:
    plans = []
    while engine.has_unfinished():
        plans.append(engine.step().plan)
        assert len(plans) < 5000, "the scheduler stopped making progress"
    return plans


@pytest.mark.parametrize(
    "mode, blocks, words",
    [
        ("paged", 3, None),  # 40 prompt tokens in blocks of 16
        ("max", 9, "reserves 9 blocks for 40 + 100 tokens (max)"),
        ("pow2", 5, "reserves 5 blocks for 40 + 32 tokens (pow2: 20 expected, rounded up)"),
        ("oracle", 4, "reserves 4 blocks for 40 + 20 tokens (oracle: the expected output length)"),
    ],
)
def test_admission_reserves_and_says_so(mode, blocks, words):
    engine = fake_engine(kv_reservation=mode)
    rid = _add(engine, 40, 100, hint=20)
    plan = engine.step().plan
    assert len(engine.block_table(rid)) == blocks
    [decision] = plan.admitted
    if words is None:
        assert "reserves" not in decision.reason
    else:
        assert decision.reason.endswith("; " + words)


def test_reservation_never_exceeds_max_tokens_nor_the_context():
    engine = fake_engine(max_model_len=64, kv_reservation="pow2")
    rid = _add(engine, 40, 20, hint=17)  # pow2 gives 32, max_tokens caps at 20, context at 24
    plan = engine.step().plan
    assert "40 + 20 tokens" in plan.admitted[0].reason
    assert len(engine.block_table(rid)) == 4


def test_without_a_hint_the_expected_length_is_max_tokens():
    engine = fake_engine(kv_reservation="oracle")
    _add(engine, 8, 24)
    assert "8 + 24 tokens" in engine.step().plan.admitted[0].reason


@pytest.mark.parametrize("mode", ["max", "pow2", "oracle"])
def test_a_right_hint_never_takes_another_block(mode):
    engine = fake_engine(kv_reservation=mode, max_num_batched_tokens=16)
    engine.runner.output_lengths = {0: 30, 1: 3}
    _add(engine, 40, 64, hint=30)  # a prompt in three chunks, then 30 tokens
    _add(engine, 5, 64, hint=3)
    plans = _run(engine)
    tables, state = {}, KVState()
    for plan in plans:
        state.apply(plan.kv_ops)  # the map after each step, from its changes
        for rid, table in state.block_tables.items():
            assert tables.setdefault(rid, list(table)) == table, f"request {rid} grew"
        assert not any("outgrew" in note for note in plan.notes)
    assert set(tables) == {0, 1}


def test_a_short_hint_grows_paged_and_says_so():
    engine = fake_engine(kv_reservation="oracle")
    engine.runner.output_lengths = {0: 40}
    _add(engine, 10, 64, hint=5)  # reserves 15 tokens (1 block), writes 49
    outs = []
    notes = []
    while engine.has_unfinished():
        result = engine.step()
        outs += result.finished
        notes += [n for n in result.plan.notes if "outgrew" in n]
    assert len(outs[0].token_ids) == 40
    # 1 block reserved; blocks 2, 3 and 4 come paged, one at a time.
    note = (
        "request 0 outgrew its oracle reservation (expected_output_tokens was too small): "
        "1 more block(s), paged"
    )
    assert notes == [note] * 3


def test_reserving_more_batches_fewer_requests():
    """The vLLM paper's point: the same pool holds fewer requests the more each reserves."""
    peaks = {}
    for mode in MODES:
        engine = fake_engine(num_kv_blocks=40, kv_reservation=mode)
        engine.runner.output_lengths = {i: 20 for i in range(12)}
        for i in range(12):
            _add(engine, 20, 200, hint=20, token=10 + i)  # distinct: no prefix is shared
        plans = _run(engine)
        peaks[mode] = max(p.slots_used for p in plans)
        assert engine.kv_snapshot().num_used == 0
    # 40 blocks; max: 14 each (2 fit); pow2: 20 + 32 tokens, 4 (10 fit); oracle: 20 + 20, 3.
    assert peaks == {"paged": 12, "max": 2, "pow2": 10, "oracle": 12}


def test_max_reservation_waits_for_room_and_says_which_mode():
    engine = fake_engine(num_kv_blocks=20, kv_reservation="max")
    _add(engine, 16, 200)
    _add(engine, 16, 200)
    plan = engine.step().plan
    assert [d.request_id for d in plan.admitted] == [0]
    assert "request 1 waits: needs 14 blocks, 6 free (max reservation)" in plan.notes


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_frees_the_reservation(preemption):
    # Two requests reserve 2 blocks each of a 5-block pool, then outgrow them: one must go.
    engine = fake_engine(
        num_kv_blocks=5, kv_reservation="oracle", preemption_mode=preemption, num_swap_blocks=8
    )
    engine.runner.output_lengths = {0: 40, 1: 40}
    _add(engine, 16, 48, hint=8)
    _add(engine, 16, 48, hint=8)
    preempted = []
    outs = []
    while engine.has_unfinished():
        result = engine.step()
        plan = result.plan
        outs += result.finished
        kv = engine.kv_snapshot()
        for d in plan.preempted:
            preempted.append(d.request_id)
            assert d.request_id not in kv.block_tables  # its device blocks are all free
            if preemption == "swap" and d.request_id in kv.swap_tables:
                assert len(kv.swap_tables[d.request_id]) >= 2  # reservation copied out
        engine.scheduler.blocks.check()
    assert preempted
    assert sorted(len(o.token_ids) for o in outs) == [40, 40]
    kv = engine.kv_snapshot()
    assert kv.num_used == 0 and kv.num_swapped == 0


def test_a_recomputed_request_past_its_reservation_says_it_grows_paged():
    engine = fake_engine(num_kv_blocks=5, kv_reservation="oracle", preemption_mode="recompute")
    engine.runner.output_lengths = {0: 40, 1: 40}
    _add(engine, 16, 48, hint=8)
    _add(engine, 16, 48, hint=8)
    reasons = [d.reason for p in _run(engine) for d in p.admitted]
    assert any("already past its reservation of 16 + 8 tokens" in r for r in reasons)


@pytest.mark.parametrize(
    "hint, words",
    [(0, "positive integer, got 0"), (True, "got True"), (65, "exceeds max_tokens=64")],
)
def test_a_bad_hint_is_refused_and_nothing_is_queued(hint, words):
    engine = fake_engine(kv_reservation="oracle")
    with pytest.raises(RequestRejected, match=words):
        _add(engine, 4, 64, hint=hint)
    assert engine.queue_sizes() == {"waiting": 0, "running": 0, "swapped": 0}


def test_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="kv_reservation 'huge'; choose one of paged, max"):
        EngineConfig.from_kwargs(kv_reservation="huge")


def test_command_line_option():
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    assert engine_kwargs(parser.parse_args([]))["kv_reservation"] == "paged"
    assert engine_kwargs(parser.parse_args(["--kv-reservation", "pow2"]))["kv_reservation"] == (
        "pow2"
    )


def test_describe_names_the_mode():
    engine = fake_engine(kv_reservation="max")
    assert engine.describe()["config"]["kv_reservation"] == "max"


request_st = st.tuples(
    st.integers(1, 40),  # prompt length
    st.integers(1, 30),  # max_tokens
    st.integers(1, 30),  # real output length (capped at max_tokens)
    st.sampled_from(["none", "right", "short", "long"]),  # the hint
    st.integers(0, 6),  # arrival step
)


@settings(max_examples=120, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    preemption=st.sampled_from(["recompute", "swap"]),
    caching=st.booleans(),
    block_size=st.sampled_from([1, 4, 16]),
    budget=st.integers(1, 64),
    pool_tokens=st.integers(32, 160),
    requests=st.lists(request_st, min_size=1, max_size=12),
)
def test_random_workloads_never_leak_a_block(
    mode, preemption, caching, block_size, budget, pool_tokens, requests
):
    engine = fake_engine(
        num_kv_blocks=max(1, pool_tokens // block_size),
        max_model_len=1024,
        kv_reservation=mode,
        preemption_mode=preemption,
        enable_prefix_caching=caching,
        block_size=block_size,
        max_num_batched_tokens=budget,
        num_swap_blocks=pool_tokens // block_size // 2,
    )
    expected = {}
    pending = sorted(enumerate(requests), key=lambda x: x[1][4])
    finished = {}
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1][4] <= step:
            i, (plen, mtok, real, hint_kind, _) = pending.pop(0)
            real = min(real, mtok)
            hint = {"none": None, "right": real, "short": max(1, real // 3), "long": mtok}
            try:
                rid = _add(engine, plen, mtok, hint[hint_kind], token=3 + i % 2)
            except RequestRejected:
                continue
            engine.runner.output_lengths[rid] = real
            expected[rid] = real
        result = engine.step()
        finished.update({o.request_id: len(o.token_ids) for o in result.finished})
        engine.scheduler.blocks.check()
        for row in result.plan.scheduled:
            assert len(row.block_table) * block_size >= row.context_len
        step += 1
        assert step < 5000, "the scheduler stopped making progress"
    assert finished == expected
    kv = engine.kv_snapshot()
    assert kv.num_used == 0 and kv.num_swapped == 0


def test_every_reservation_reason_has_a_chinese_pattern():
    from tests.test_i18n import _reason_patterns

    patterns = _reason_patterns()
    seen = set()
    for mode in ["max", "pow2", "oracle"]:
        engine = fake_engine(num_kv_blocks=5, kv_reservation=mode, preemption_mode="recompute")
        engine.runner.output_lengths = {0: 40, 1: 40, 2: 3}
        for _ in range(3):
            _add(engine, 16, 48, hint=8)
        for plan in _run(engine):
            seen.update(d.reason for d in plan.admitted + plan.preempted + plan.finished)
            seen.update(plan.notes)
    kinds = ["reserves", "already past its reservation", "outgrew", "reservation)"]
    assert all(any(k in r for r in seen) for k in kinds)  # the runs met every kind
    untranslated = sorted(r for r in seen if not any(p.match(r) for p in patterns))
    assert untranslated == []
