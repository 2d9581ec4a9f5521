"""The draft-model and early-exit proposers (minicb/speculation/model_proposer.py) inside
the real engine on the tiny Llama, fp32:

- the target as its own draft (the same folder; early exit with every layer) is accepted
  every time: k + 1 tokens a round, in continuous and static batching;
- greedy tokens equal speculation off (the one-request-at-a-time reference) across chunk
  sizes, block sizes, both preemption modes (a pool small enough to preempt), prefix caching
  and overlap scheduling, with a draft that is often wrong (another model, one layer of two);
  with the 8-bit KV cache, equal to speculation off on the same cache;
- a draft whose vocabulary is not the target's, draft_layers beyond the model's, and a
  missing draft_model are refused, naming the limit.
"""

import pytest

from minicb import LLM, SamplingParams
from tests.helpers import MIXED, MIXED_MAX, greedy_tokens

K = 4


def make_llm(model, **options):
    base = dict(dtype="float32", num_kv_blocks=64, block_size=16, num_speculative_tokens=K)
    return LLM(model=model, **{**base, **options})


@pytest.mark.parametrize("batching", ["continuous", "static"])
@pytest.mark.parametrize("proposer", ["draft", "early_exit"])
def test_target_as_its_own_draft_is_always_accepted(tiny_llama_dir, batching, proposer):
    options = {"draft_model": tiny_llama_dir} if proposer == "draft" else {"draft_layers": 2}
    llm = make_llm(tiny_llama_dir, batching=batching, speculative=proposer, **options)
    rounds = 4
    params = SamplingParams(max_tokens=1 + rounds * (K + 1), temperature=0.0, ignore_eos=True)
    outs = llm.generate(MIXED[:4], params)
    for out in outs:
        # The first token comes from the prefill; then every round keeps K guesses + 1.
        assert out.metrics.num_draft_tokens == rounds * K
        assert out.metrics.num_accepted_tokens == rounds * K


CASES = {
    "chunks of 8": dict(max_num_batched_tokens=8),
    "chunks of 64, blocks of 4": dict(max_num_batched_tokens=64, block_size=4),
    "recompute preemption": dict(num_kv_blocks=18, block_size=4, preemption_mode="recompute"),
    "swap preemption": dict(num_kv_blocks=18, block_size=4, preemption_mode="swap"),
    "overlap": dict(overlap_scheduling=True),
    "static": dict(batching="static", max_num_seqs=4),
}


@pytest.mark.slow  # 12 engines: ~50 s on two cores
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("proposer", ["draft", "early_exit"])
def test_greedy_tokens_equal_speculation_off(
    tiny_llama_dir, other_llama_dir, mixed_reference, case, proposer
):
    options = {"draft_model": other_llama_dir} if proposer == "draft" else {"draft_layers": 1}
    llm = make_llm(tiny_llama_dir, speculative=proposer, **options, **CASES[case])
    tokens = greedy_tokens(llm, MIXED, MIXED_MAX)
    assert tokens == mixed_reference
    assert_nothing_held(llm)


def assert_nothing_held(llm):
    """No target block is held once every request left, and no draft block after the next
    schedule (where the drafter frees what requests that left held)."""
    engine = llm.engine
    assert engine.scheduler.blocks.num_used_blocks == 0
    engine.scheduler.schedule()  # an empty plan; its drafter hook frees what they held
    assert engine.scheduler.drafter.proposer.kv.num_used_blocks == 0


def test_prefix_caching_keeps_the_tokens(tiny_llama_dir, shared_reference):
    from tests.helpers import SHARED, SHARED_MAX

    llm = make_llm(
        tiny_llama_dir, speculative="early_exit", draft_layers=1, enable_prefix_caching=True
    )
    assert greedy_tokens(llm, SHARED, SHARED_MAX) == shared_reference


def test_errors_name_the_limit(tiny_llama_dir, wide_llama_dir, tmp_path):
    with pytest.raises(ValueError, match="vocabulary of 300 tokens.*256"):
        make_llm(tiny_llama_dir, speculative="draft", draft_model=wide_llama_dir)
    with pytest.raises(ValueError, match="draft_layers=3 exceeds the target's 2 decoder layers"):
        make_llm(tiny_llama_dir, speculative="early_exit", draft_layers=3)
    with pytest.raises(ValueError, match="needs draft_model"):
        make_llm(tiny_llama_dir, speculative="draft")
    with pytest.raises(ValueError, match="cannot be opened"):
        make_llm(tiny_llama_dir, speculative="draft", draft_model=str(tmp_path / "nowhere"))


def test_int8_kv_tokens_equal_speculation_off_with_the_same_cache(tiny_llama_dir):
    """The 8-bit KV cache's own rule: its tokens may differ from the fp32 reference (the
    cache rounds), so speculation is compared with the same cache, off. The draft's pool
    takes the target's format."""
    off = greedy_tokens(make_llm(tiny_llama_dir, kv_cache_dtype="int8"), MIXED, MIXED_MAX)
    llm = make_llm(tiny_llama_dir, kv_cache_dtype="int8", speculative="early_exit", draft_layers=1)
    assert greedy_tokens(llm, MIXED, MIXED_MAX) == off
    assert len(llm.engine.scheduler.drafter.proposer.kv.pool.parts) == 2  # values, scales
