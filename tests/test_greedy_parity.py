"""The correctness oracle on the default model: minicb's greedy tokens equal transformers'.

Eight prompts of different lengths are decoded together as one ragged batch and compared
with transformers' ``generate`` run on each prompt alone, for block sizes 1, 16 and 32.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from minicb import LLM, SamplingParams

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


@pytest.fixture(scope="module")
def reference_tokens(default_llm):
    tok = default_llm.tokenizer
    hf = AutoModelForCausalLM.from_pretrained(
        default_llm.engine.runner.files.path, dtype=torch.float32
    ).eval()
    # No eos, so neither side stops early (min_new_tokens would mask eos instead).
    hf.generation_config.eos_token_id = None
    expected = []
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
        with torch.inference_mode():
            out = hf.generate(
                ids,
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                attention_mask=torch.ones_like(ids),
                pad_token_id=tok.pad_token_id,
            )
        expected.append(out[0, ids.shape[1] :].tolist())
    return expected


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_ragged_batch_matches_transformers(block_size, default_llm, reference_tokens):
    llm = (
        default_llm
        if block_size == 16
        else LLM(dtype="float32", block_size=block_size, num_kv_blocks=8192 // block_size)
    )
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == reference_tokens


@pytest.mark.slow
def test_chat_answers_capital_of_france(default_llm):
    out = default_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(max_tokens=24, temperature=0.0),
    )
    assert "Paris" in out.text
    assert out.finish_reason == "stop"
