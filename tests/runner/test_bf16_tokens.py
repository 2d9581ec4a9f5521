"""Greedy tokens in bfloat16 (what "auto" runs on CUDA and on CPUs with native bf16) against
transformers' own bfloat16 on the same weights.

bfloat16 keeps 8 significant bits, and two implementations round at different places
(other kernels, another reduction order, another batch shape), so exact equality is not
expected; the exact oracle runs in float32 (tests/test_greedy_parity.py). What is checked
here: minicb's tokens follow transformers' until their first difference, and there
transformers' own logits put minicb's token within TIE_STEPS bf16 steps of their top one:
a near-tie that rounding can flip, never a clear mistake.
"""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from minicb import LLM, SamplingParams
from minicb.tiny_models import TINY_ARCHITECTURES, make_tiny_model_dir

TIE_STEPS = 4  # bf16 steps at the top logit's magnitude


def bf16_step(x: float) -> float:
    """The spacing of bfloat16 numbers near ``x`` (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids, max_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(ids)
        )
    return out[0, len(prompt) :].tolist()


def check_near_ties(model, prompts, ours: list[list[int]], n: int) -> int:
    """Assert the rule above for every prompt; returns how many matched all ``n`` tokens."""
    model.generation_config.eos_token_id = None  # neither side stops early
    model.generation_config.pad_token_id = 0
    exact = 0
    for prompt, got in zip(prompts, ours, strict=True):
        want = hf_greedy(model, prompt, n)
        k = next((i for i in range(n) if got[i] != want[i]), None)
        if k is None:
            exact += 1
            continue
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + want[:k]])).logits[0, -1].float()
        top = logits.max().item()
        gap = top - logits[got[k]].item()
        assert gap <= TIE_STEPS * bf16_step(top), (prompt, k, gap, top)
    return exact


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_tiny_models_in_bf16_follow_transformers_bf16(arch, tmp_path):
    path = make_tiny_model_dir(arch, tmp_path, seed=0)
    prompts = [[5 + 13 * i + j for j in range(3 + 4 * i)] for i in range(6)]
    llm = LLM(model=str(path), dtype="bfloat16", num_kv_blocks=64, block_size=4)
    assert llm.engine.describe()["runner"]["dtype"] == "bfloat16"
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ours = [o.token_ids for o in llm.generate(prompts, params)]  # one ragged batch
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    check_near_ties(hf, prompts, ours, 12)


@pytest.mark.slow
def test_default_model_in_bf16_follows_transformers_bf16():
    llm = LLM(dtype="bfloat16", num_kv_blocks=256, block_size=16)
    texts = ["The capital of France is", "def add(a, b):", "Water boils at", "Once upon a time"]
    prompts = [llm.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ours = [o.token_ids for o in llm.generate(prompts, params)]
    path = llm.engine.runner.files.path
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    # Measured on the AMX machine: all 4 equal in full. Other CPUs run other bf16 kernels,
    # so only the near-tie rule is promised, and that at least one prompt agrees in full.
    assert check_near_ties(hf, prompts, ours, 24) >= 1
