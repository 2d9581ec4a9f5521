"""The correctness oracle: minicb's greedy tokens equal transformers' ``generate``.

Prompts of different lengths are decoded together as one ragged batch and compared with
``generate`` run on each prompt alone: on a tiny random model of every supported
architecture, plainly and with small chunks, one-token blocks and preemption by swap and by
recompute; and on the default model, plainly and with chunks and preemption at once.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from minicb import LLM, SamplingParams
from minicb.tiny_models import TINY_ARCHITECTURES, make_tiny_model_dir
from tests.helpers import greedy_tokens, mixed_prompts

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def add(a, b):",
    "List three colours:",
    "Water boils at",
    "In 1492, Columbus",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Q: What is two plus two?\nA:",
]
NEW_TOKENS = 32


def hf_greedy(path: str, prompts: list[list[int]], new_tokens: int, pad_id: int) -> list:
    """transformers' greedy ``generate`` on each prompt alone: the new token ids."""
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # No eos, so neither side stops early (min_new_tokens would mask eos instead).
    hf.generation_config.eos_token_id = None
    expected = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = hf.generate(
                ids,
                max_new_tokens=new_tokens,
                do_sample=False,
                attention_mask=torch.ones_like(ids),
                pad_token_id=pad_id,
            )
        expected.append(out[0, ids.shape[1] :].tolist())
    return expected


def preempted(llm: LLM) -> list:
    """Subscribe to ``llm``'s steps; the list fills with every preemption decision."""
    decisions: list = []
    llm.engine.bus.subscribe(
        lambda es: decisions.extend(d for e in es for d in e.plan.preempted), kinds=["step"]
    )
    return decisions


TINY_PROMPTS = mixed_prompts(6, vocab=256, seed=5, min_len=1, max_len=30)
TINY_NEW = 12
# Each architecture runs plainly and under pressure: 5-token chunks, one-token blocks and a
# pool of 60 tokens for six requests of up to 42, so requests are preempted.
TINY_CONFIGS = {
    "plain": dict(num_kv_blocks=64, block_size=16),
    "chunk-5-block-1-swap": dict(
        num_kv_blocks=60, block_size=1, max_num_batched_tokens=5, preemption_mode="swap"
    ),
    "block-4-recompute": dict(num_kv_blocks=15, block_size=4, preemption_mode="recompute"),
    # Fixed tiles change the order of every sum, yet not what generate's tokens are.
    "batch-invariant-chunk-5": dict(
        num_kv_blocks=64, block_size=16, max_num_batched_tokens=5, batch_invariant=True
    ),
}


@pytest.fixture(scope="module", params=TINY_ARCHITECTURES)
def tiny_model(request, tmp_path_factory):
    """(folder, generate's tokens) for a tiny random model of each architecture."""
    path = str(make_tiny_model_dir(request.param, tmp_path_factory.mktemp(request.param), seed=2))
    return path, hf_greedy(path, TINY_PROMPTS, TINY_NEW, pad_id=0)


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_tiny_greedy_matches_generate(name, tiny_model):
    path, expected = tiny_model
    llm = LLM(model=path, dtype="float32", **TINY_CONFIGS[name])
    decisions = preempted(llm)
    assert greedy_tokens(llm, TINY_PROMPTS, TINY_NEW) == expected
    if "preemption_mode" in TINY_CONFIGS[name]:
        assert TINY_CONFIGS[name]["preemption_mode"] in {d.mode for d in decisions}


@pytest.fixture(scope="module")
def reference_tokens(default_llm):
    tok = default_llm.tokenizer
    prompts = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    return hf_greedy(default_llm.engine.runner.files.path, prompts, NEW_TOKENS, tok.pad_token_id)


@pytest.mark.slow
def test_ragged_batch_matches_transformers(default_llm, reference_tokens):
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outs = default_llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == reference_tokens


@pytest.mark.slow
def test_chunked_preempted_batch_matches_transformers(reference_tokens):
    """One-token blocks, 7-token chunks and a pool of 160 tokens for eight requests of up to
    ~50: every prompt is chunked and requests are preempted (swap, and recompute when the
    swap space of 40 tokens is full)."""
    llm = LLM(
        dtype="float32",
        block_size=1,
        num_kv_blocks=160,
        num_swap_blocks=40,
        max_num_batched_tokens=7,
        preemption_mode="swap",
    )
    decisions = preempted(llm)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == reference_tokens
    assert {d.mode for d in decisions} == {"swap", "recompute"}


@pytest.mark.slow
def test_chat_answers_capital_of_france(default_llm):
    out = default_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(max_tokens=24, temperature=0.0),
    )
    assert "Paris" in out.text
    assert out.finish_reason == "stop"
