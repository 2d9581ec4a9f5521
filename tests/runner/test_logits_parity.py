"""minicb's model against transformers' on the same weights: logits agree to 1e-4 in fp32.

Every supported architecture is checked on a tiny random config, with the prompt both
prefilled at once and split in chunks that read earlier tokens back from the paged cache.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from minicb.core.attention import AttentionMetadata
from minicb.core.config import EngineConfig
from minicb.core.runner.loader import open_model
from minicb.core.runner.model_runner import ModelRunner
from minicb.tiny_models import TINY_ARCHITECTURES, make_tiny_model_dir


def minicb_logits(runner: ModelRunner, prompts: list[list[int]], chunks: int) -> list[torch.Tensor]:
    """Run all prompts as one ragged batch, in ``chunks`` pieces; logits of every position."""
    bs = runner.config.block_size
    tables, next_block = [], 0
    for p in prompts:
        n = -(-len(p) // bs)
        tables.append(list(range(next_block, next_block + n)))
        next_block += n
    pieces = [[] for _ in prompts]
    done = [0] * len(prompts)
    for c in range(chunks):
        ids, pos, slots, qlens, clens = [], [], [], [], []
        for i, p in enumerate(prompts):
            end = len(p) * (c + 1) // chunks
            span = range(done[i], end)
            ids += [p[j] for j in span]
            pos += list(span)
            slots += [tables[i][j // bs] * bs + j % bs for j in span]
            qlens.append(len(span))
            clens.append(end)
        meta = AttentionMetadata.build(qlens, clens, tables, slots, runner.device)
        with torch.inference_mode():
            hidden = runner.model(
                torch.tensor(ids), torch.tensor(pos), meta, runner.kv_caches, runner.backend
            )
            logits = runner.model.logits(hidden)
        start = 0
        for i, q in enumerate(qlens):
            pieces[i].append(logits[start : start + q])
            start += q
            done[i] += q
    return [torch.cat(p) for p in pieces]


def hf_logits(path, prompts) -> list[torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        return [model(torch.tensor([p])).logits[0].float() for p in prompts]


PROMPTS = [
    [5, 17, 3, 99, 42, 7, 8],
    [11],
    [200, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18],
]


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
@pytest.mark.parametrize("chunks", [1, 3])
def test_tiny_logits_match_transformers(arch, chunks, tmp_path):
    path = make_tiny_model_dir(arch, tmp_path, seed=1)
    runner = ModelRunner(str(path), EngineConfig(dtype="float32", num_kv_blocks=32, block_size=4))
    ours = minicb_logits(runner, PROMPTS, chunks)
    theirs = hf_logits(path, PROMPTS)
    for a, b in zip(ours, theirs, strict=True):
        assert (a - b).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_default_model_logits_match_transformers():
    files = open_model(None)
    runner = ModelRunner(None, EngineConfig(dtype="float32", num_kv_blocks=64), files=files)
    prompts = [
        files.tokenizer.encode(t) for t in ("The capital of France is", "def fibonacci(n):\n   ")
    ]
    ours = minicb_logits(runner, prompts, chunks=2)
    theirs = hf_logits(files.path, prompts)
    for a, b in zip(ours, theirs, strict=True):
        assert (a - b).abs().max().item() <= 1e-4
