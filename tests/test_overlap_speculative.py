"""Overlap scheduling together with speculative decoding gives the same greedy tokens as
the plain step loop, with drafts really accepted (so no test passes by never speculating).

The design under test (docs/architecture.md, "Overlap scheduling"): a plan that verifies
drafts is waited for before the next plan is made, since how many drafts it accepts decides
where its requests' next rows start; a plan made while another is in flight may still
draft, guessing the placeholder from the n-gram lookup. FakeRunner in every mode the
overlap tests cover (tokens that repeat, so drafts hit), the tiny Llama in the modes of
tests/test_overlap.py's real-model tests, and the default model once (slow). The property
machine with drafts is tests/scheduler/test_overlap_machine.py.
"""

from __future__ import annotations

import pytest

from minicb import LLM, SamplingParams
from minicb.overlap.bookkeeping import PLACEHOLDER
from tests.helpers import MIXED, MIXED_MAX, SHARED, SHARED_MAX, fake_engine, greedy_tokens
from tests.test_overlap import FAKE_CONFIGS, assert_preempted_as
from tests.test_same_tokens_everywhere import record_plans
from tests.test_speculative_decoding import Watch

SPEC = dict(speculative="ngram", num_speculative_tokens=3)
PREFIX = [9, 8, 7, 6, 5, 4, 3, 9]


def repeating(rid: int, index: int) -> int:
    """Tokens that repeat in pairs (drafts are accepted), different per request."""
    return 10 + (rid + index // 2) % 4


def _fake_run(overlap: bool, abort_after: dict[int, int] | None = None, **options):
    """Eight requests of varied lengths, three stopped early by a stop token: outputs,
    every token streamed per request, and the plans."""
    options = dict(num_kv_blocks=64, block_size=4, max_num_seqs=4) | SPEC | options
    engine = fake_engine(max_model_len=64, overlap_scheduling=overlap, **options)
    engine.runner.token_fn = repeating
    for i in range(8):
        prompt = PREFIX + [10 + i % 4, 11 + i % 3] * (1 + i % 4)
        rid = engine.add_request(prompt, SamplingParams(max_tokens=4 + i, temperature=0))
        if i % 3 == 1:
            engine.runner.output_lengths[rid] = 3 + i // 2
    outputs, streamed, plans = {}, {}, []
    abort_after = abort_after or {}
    while engine.has_unfinished():
        result = engine.step()
        plans.append(result.plan)
        for delta in result.new_tokens:
            streamed.setdefault(delta.request_id, []).append(delta.token_id)
            if len(streamed[delta.request_id]) == abort_after.get(delta.request_id):
                engine.abort_request(delta.request_id)
        outputs |= {o.request_id: (o.token_ids, o.finish_reason) for o in result.finished}
    engine.scheduler.blocks.check()
    assert engine.kv_snapshot().num_used == 0 and engine.kv_snapshot().num_swapped == 0
    assert [p.step for p in plans] == list(range(1, len(plans) + 1))
    return outputs, streamed, plans


@pytest.mark.parametrize("name", FAKE_CONFIGS)
def test_same_tokens_with_overlap_and_speculation_on_fake_runner(name):
    options = FAKE_CONFIGS[name]
    plain = _fake_run(False, **options)
    outputs, streamed, plans = _fake_run(True, **options)
    assert outputs == plain[0]
    assert streamed == plain[1]
    assert all(PLACEHOLDER not in tokens for tokens, _ in outputs.values())
    assert sum(p.num_accepted_tokens for p in plans) > 0, "no draft was accepted"
    if "preemption_mode" in options:
        assert_preempted_as(plans, options["preemption_mode"])


def test_drafts_guessed_under_a_placeholder_are_verified_against_the_real_token():
    """A plan made while another is in flight drafts on a guess of the token in flight
    (its row's input is then that real token, filled in at launch): some of those drafts
    are accepted, and the tokens stay exact. A row whose last input is a placeholder may
    never reach the runner."""
    engine = fake_engine(num_kv_blocks=64, block_size=4, overlap_scheduling=True, **SPEC)
    engine.runner.token_fn = repeating
    launched = []
    real_execute = engine.runner.execute

    def execute(plan):
        for row in plan.scheduled:
            assert PLACEHOLDER not in row.token_ids, "a placeholder reached the runner"
        launched.append({r.request_id: r.num_draft_tokens for r in plan.scheduled})
        return real_execute(plan)

    engine.runner.execute = execute
    guessed = 0
    for i in range(3):
        engine.add_request(PREFIX + [10 + i] * 3, SamplingParams(max_tokens=12, temperature=0))
    outputs = {}
    while engine.has_unfinished():
        in_flight = engine.strategy.in_flight
        waits = in_flight is not None and in_flight.verifies_drafts
        result = engine.step()
        if in_flight is not None and not waits:  # the next plan was made beside it
            nxt = engine.strategy.in_flight
            guessed += nxt is not None and sum(r.num_draft_tokens for r in nxt.plan.scheduled)
        outputs |= {o.request_id: o.token_ids for o in result.finished}
    assert guessed > 0
    assert outputs == {rid: [repeating(rid, i) for i in range(12)] for rid in range(3)}


def test_aborts_with_overlap_and_speculation():
    aborts = {0: 1, 3: 2, 5: 5}
    plain = _fake_run(False, abort_after=aborts)
    outputs, streamed, _ = _fake_run(True, abort_after=aborts)
    assert outputs == plain[0] and set(outputs).isdisjoint(aborts)
    assert streamed == plain[1]


def test_a_failed_step_that_verified_drafts_is_undone_and_retried():
    """The runner fails on a plan with drafts: it is undone (nothing was advanced for its
    drafted rows), and stepping again gives the same tokens as without the failure."""
    engine = fake_engine(num_kv_blocks=32, block_size=4, overlap_scheduling=True, **SPEC)
    engine.runner.token_fn = repeating
    real_execute, failed = engine.runner.execute, []

    def execute(plan):
        if not failed and any(r.num_draft_tokens for r in plan.scheduled):
            failed.append(plan.step)
            raise RuntimeError("injected")
        return real_execute(plan)

    engine.runner.execute = execute
    for n in (3, 6, 9):
        engine.add_request([10, 10, 11] * n, SamplingParams(max_tokens=8, temperature=0))
    outputs = {}
    while engine.has_unfinished():
        try:
            result = engine.step()
        except RuntimeError:
            assert engine.strategy.in_flight is None
            continue
        outputs |= {o.request_id: o.token_ids for o in result.finished}
    assert failed
    assert outputs == {rid: [repeating(rid, i) for i in range(8)] for rid in range(3)}
    assert engine.kv_snapshot().num_used == 0


# ---- the real model ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        dict(max_num_batched_tokens=16),
        dict(batching="static", max_num_seqs=6),
        dict(num_kv_blocks=5, preemption_mode="swap", max_num_batched_tokens=32),
        dict(num_kv_blocks=5, preemption_mode="recompute", max_num_batched_tokens=32),
    ],
    ids=["chunk-16", "static", "swap", "recompute"],
)
def test_same_tokens_with_overlap_and_speculation_on_tiny_model(
    options, tiny_llama_dir, mixed_reference
):
    llm = LLM(
        model=tiny_llama_dir,
        dtype="float32",
        overlap_scheduling=True,
        **({"num_kv_blocks": 256, "block_size": 16} | SPEC | options),
    )
    plans, watch = record_plans(llm), Watch(llm)
    assert greedy_tokens(llm, MIXED, MIXED_MAX) == mixed_reference
    assert watch.accepted > 0, "no draft was accepted"
    if "preemption_mode" in options:
        assert_preempted_as(plans, options["preemption_mode"])
    assert llm.engine.kv_snapshot().num_used == 0


def test_same_tokens_with_overlap_speculation_and_prefix_caching(tiny_llama_dir, shared_reference):
    llm = LLM(
        model=tiny_llama_dir,
        dtype="float32",
        overlap_scheduling=True,
        enable_prefix_caching=True,
        num_kv_blocks=256,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        **SPEC,
    )
    plans, watch = record_plans(llm), Watch(llm)
    assert greedy_tokens(llm, SHARED, SHARED_MAX) == shared_reference
    assert sum(p.prefix_hit_tokens for p in plans) > 0
    assert watch.accepted > 0, "no draft was accepted"


@pytest.mark.slow
def test_same_tokens_with_overlap_and_speculation_on_default_model(default_llm):
    prompts = ["1, 2, 3, 4, 5,", "def add(a, b):\n    return a + b\n\ndef add(", "the cat the cat"]
    expected = greedy_tokens(default_llm, prompts, 16)
    llm = LLM(dtype="float32", num_kv_blocks=64, block_size=16, overlap_scheduling=True,
              max_num_batched_tokens=16, **SPEC)  # fmt: skip
    watch = Watch(llm)
    assert greedy_tokens(llm, prompts, 16) == expected
    assert watch.accepted > 0, "no draft was accepted"
