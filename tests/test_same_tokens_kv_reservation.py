"""The central invariant for the KV reservation modes: max, pow2 and oracle give the same
greedy tokens as paged and as one request at a time, with right, short or no hints, under
recompute and swap preemption, and with prefix caching; and no block is left behind.

A tiny random Llama, the same-tokens tests' prompts (tests/helpers.py). Where preemption or
outgrowing a reservation is the point, the test asserts that it really happened.
"""

import pytest

from minicb import LLM, SamplingParams
from tests.helpers import MIXED, MIXED_MAX, SHARED, SHARED_MAX

HINTS = {
    "right": lambda m: m,  # ignore_eos: the real output length is max_tokens
    "short": lambda m: max(1, m // 3),  # the request outgrows its reservation
    "none": lambda m: None,
}


def _generate(llm: LLM, prompts, max_tokens, hint) -> tuple[list[list[int]], list]:
    """Greedy tokens of every prompt, all arriving at once with their hints, and the plans."""
    plans = []
    llm.engine.bus.subscribe(lambda es: plans.extend(e.plan for e in es), kinds=["step"])
    ids = [
        llm.engine.add_request(
            p,
            SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True),
            priority=i % 3,
            expected_output_tokens=hint(m),
        )
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
    ]
    outs = {o.request_id: o.token_ids for o in llm.engine.run_until_done()}
    llm.engine.scheduler.blocks.check()  # the block manager's own invariants
    assert llm.engine.kv_snapshot().num_used == 0
    return [outs[i] for i in ids], plans


def _outgrew(plans) -> bool:
    return any("outgrew" in note for p in plans for note in p.notes)


@pytest.mark.parametrize(
    "mode, hint",
    [("max", "none"), ("pow2", "right"), ("pow2", "short"), ("oracle", "right")]
    + [("oracle", "short"), ("oracle", "none")],
)
def test_same_tokens_in_every_reservation_mode(mode, hint, tiny_llama_dir, mixed_reference):
    llm = LLM(
        model=tiny_llama_dir, dtype="float32", num_kv_blocks=256, block_size=16, kv_reservation=mode
    )
    tokens, plans = _generate(llm, MIXED, MIXED_MAX, HINTS[hint])
    assert tokens == mixed_reference
    reasons = [d.reason for p in plans for d in p.admitted]
    assert all(f"({mode}" in r for r in reasons)
    assert _outgrew(plans) == (hint == "short")


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("mode", ["pow2", "oracle"])
def test_same_tokens_when_outgrown_reservations_force_preemption(
    preemption, mode, tiny_llama_dir, mixed_reference
):
    # 5 blocks of 16 for requests of up to 62 tokens that reserve a third of their output.
    llm = LLM(
        dtype="float32",
        model=tiny_llama_dir,
        num_kv_blocks=5,
        block_size=16,
        kv_reservation=mode,
        preemption_mode=preemption,
        num_swap_blocks=5,
        max_num_batched_tokens=32,
    )
    tokens, plans = _generate(llm, MIXED, MIXED_MAX, HINTS["short"])
    assert tokens == mixed_reference
    assert any(p.preempted for p in plans) and _outgrew(plans)


def test_same_tokens_with_max_reservation_in_a_small_pool(tiny_llama_dir, mixed_reference):
    # Max reserves each request's worst case: it waits for room rather than preempting.
    llm = LLM(
        model=tiny_llama_dir, dtype="float32", num_kv_blocks=5, block_size=16, kv_reservation="max"
    )
    tokens, plans = _generate(llm, MIXED, MIXED_MAX, HINTS["none"])
    assert tokens == mixed_reference
    assert not any(p.preempted for p in plans)
    assert any("(max reservation)" in note for p in plans for note in p.notes)


@pytest.mark.parametrize("preemption", [None, "recompute", "swap"])
@pytest.mark.parametrize("mode", ["max", "pow2", "oracle"])
def test_same_tokens_with_prefix_caching(preemption, mode, tiny_llama_dir, shared_reference):
    options = dict(num_kv_blocks=256, max_num_seqs=4)
    if preemption:  # a pool of 96 tokens for prompts of up to 49 + 19, short hints
        options = dict(num_kv_blocks=6, preemption_mode=preemption, num_swap_blocks=6)
    llm = LLM(
        dtype="float32",
        model=tiny_llama_dir,
        block_size=16,
        enable_prefix_caching=True,
        kv_reservation=mode,
        max_num_batched_tokens=32,
        **options,
    )
    hint = HINTS["short" if preemption else "right"]
    tokens, plans = _generate(llm, SHARED, SHARED_MAX, hint)
    assert tokens == shared_reference
    assert sum(p.prefix_hit_tokens for p in plans) > 0
    if preemption and mode != "max":
        assert any(p.preempted for p in plans)
