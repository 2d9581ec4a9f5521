"""End to end: the engine on the Triton backend (interpreted on CPU) gives the torch
backend's greedy tokens, in float32 (the oracle's dtype: bfloat16's greedy tokens may
differ at near-ties with the batch shape).

The tiny-model cases are a pairwise choice over block size (1, 4, 16), batching and
preemption (none, swap, recompute, static) and the token budget, so that every block size
meets preemption or static batching and every mode meets two block sizes, in five runs;
one short run checks the default model at block size 4 under preemption.
"""

import pytest

from minicb import LLM, SamplingParams
from tests.helpers import mixed_prompts

PROMPTS = mixed_prompts(5, vocab=256, seed=9, min_len=3, max_len=30)
PARAMS = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 3, 8, 5, 4)]

# A pool of 48 tokens holds at most two of these requests (up to 38 tokens each) at once.
CASES = {
    "block-16-mixed": dict(block_size=16, num_kv_blocks=64, max_num_batched_tokens=12),
    "block-1-swap": dict(
        block_size=1, num_kv_blocks=48, max_num_batched_tokens=12, preemption_mode="swap"
    ),
    "block-4-recompute": dict(block_size=4, num_kv_blocks=12, max_num_batched_tokens=5),
    "block-1-static": dict(block_size=1, num_kv_blocks=256, batching="static", max_num_seqs=3),
    "block-4-static": dict(
        block_size=4, num_kv_blocks=64, batching="static", max_num_batched_tokens=5
    ),
}


@pytest.fixture(scope="module")
def torch_tokens(tiny_llama_dir):
    llm = LLM(model=tiny_llama_dir, dtype="float32", attention_backend="torch", num_kv_blocks=64)
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]


@pytest.mark.slow  # an engine on the Triton interpreter, per case
@pytest.mark.parametrize("name", CASES)
def test_triton_backend_matches_torch_backend(name, tiny_llama_dir, torch_tokens):
    options = CASES[name]
    llm = LLM(model=tiny_llama_dir, dtype="float32", attention_backend="triton", **options)
    plans = []
    llm.engine.bus.subscribe(lambda es: plans.extend(e.plan for e in es), kinds=["step"])
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == torch_tokens
    assert all(p.batching == options.get("batching", "continuous") for p in plans)
    preemptions = {d.mode for p in plans for d in p.preempted}
    if options.get("batching") == "static":
        assert not preemptions
    elif options["num_kv_blocks"] * options["block_size"] < 64:
        assert options.get("preemption_mode", "recompute") in preemptions
    else:  # the roomy pool: prefill chunks and decodes share iterations instead
        mixed = [{row.phase for row in p.scheduled} >= {"prefill", "decode"} for p in plans]
        assert any(mixed), "no iteration mixed a prefill chunk with decodes"


@pytest.mark.slow
def test_triton_backend_on_default_model_under_preemption(default_llm):
    """Two short prompts at block size 4 in a pool of 4 blocks: one is preempted."""
    prompts = ["The capital of France is", "Once upon a time"]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    expected = [o.token_ids for o in default_llm.generate(prompts, params)]
    llm = LLM(dtype="float32", attention_backend="triton", block_size=4, num_kv_blocks=4)
    preempted = []
    llm.engine.bus.subscribe(
        lambda es: preempted.extend(d for e in es for d in e.plan.preempted), kinds=["step"]
    )
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert preempted
