"""End to end: the engine on the Triton backend (interpreted on CPU) gives the torch
backend's greedy tokens, with prefill chunks and decodes sharing iterations."""

from minicb import LLM, SamplingParams
from tests.helpers import mixed_prompts


def test_triton_backend_matches_torch_backend(tiny_llama_dir):
    prompts = mixed_prompts(5, vocab=256, seed=9, min_len=3, max_len=30)
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 3, 8, 5, 4)
    ]
    options = dict(num_kv_blocks=64, block_size=16, max_num_batched_tokens=12)
    torch_llm = LLM(model=tiny_llama_dir, attention_backend="torch", **options)
    triton_llm = LLM(model=tiny_llama_dir, attention_backend="triton", **options)
    mixed_steps = []

    def watch(event):
        phases = {row.phase for row in event.plan.scheduled}
        mixed_steps.append(phases >= {"prefill", "decode"})

    triton_llm.engine.bus.subscribe(watch, kinds=["step"])
    expected = [o.token_ids for o in torch_llm.generate(prompts, params)]
    got = [o.token_ids for o in triton_llm.generate(prompts, params)]
    assert got == expected
    assert any(mixed_steps), "no iteration mixed a prefill chunk with decodes"
