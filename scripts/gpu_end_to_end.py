"""GPU check, section 4: end to end on random-weight models in real shapes.

Greedy tokens of the triton and torch backends and of transformers' generate are compared,
and decode tokens/s is measured with and without CUDA graphs (bf16; fp32 runs only check
parity). Decode tokens/s is B*(N-1) / (t(N tokens) - t(1 token)), so prefill time cancels out.
``dry`` selects a toy model and toy lengths that run on CPU.
"""

from __future__ import annotations

import gc
import random
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gpu_check import Report


def model_configs(dry: bool) -> dict:
    """Model shapes by name: the real ones, or one tiny Llama for a dry run."""
    from transformers import LlamaConfig, Qwen2Config

    if dry:
        from minicb.tiny_models import tiny_hf_config

        return {"tiny-llama": tiny_hf_config("llama", tie_word_embeddings=True)}
    common = dict(max_position_embeddings=4096, tie_word_embeddings=True, head_dim=64)
    return {
        "SmolLM2-135M-shape": LlamaConfig(
            num_hidden_layers=30,
            hidden_size=576,
            intermediate_size=1536,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            **common,
        ),
        "Qwen2-0.5B-shape": Qwen2Config(
            num_hidden_layers=24,
            hidden_size=896,
            intermediate_size=4864,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            **common,
        ),
    }


def make_model(cfg, folder: Path, device: torch.device, dry: bool):
    """A seeded random model in cfg's shape, saved to folder; returned for transformers' run."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    dtype = torch.float32 if dry else torch.bfloat16
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(folder)
    return model.eval()


def hf_generate(model, device):
    """transformers' greedy generate as ``fn(prompts, n) -> new tokens``; ragged prompts go
    one at a time, so padding never differs from the engine's ragged batches."""

    def generate(prompts: list[list[int]], n: int) -> list[list[int]]:
        same_len = len({len(p) for p in prompts}) == 1
        out = []
        for batch in [prompts] if same_len else [[p] for p in prompts]:
            ids = torch.tensor(batch, device=device)
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=0,
            )
            out += gen[:, ids.shape[1] :].tolist()
        return out

    return generate


def engine_generate(folder: Path, device, backend: str, graphs: bool, dtype: str, kv: str):
    """minicb's LLM as ``fn(prompts, n) -> new tokens``; the engine lives in the closure."""
    from minicb import LLM, SamplingParams

    llm = LLM(
        model=str(folder),
        dtype=dtype,
        kv_cache_dtype=kv,
        device=str(device),
        attention_backend=backend,
        use_cuda_graphs=graphs,
        num_kv_blocks=2048,
        num_swap_blocks=0,
        max_model_len=2048,
    )

    def generate(prompts: list[list[int]], n: int) -> list[list[int]]:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        return [out.token_ids for out in llm.generate(prompts, params)]

    return generate


def decode_rate(generate, bench: list[list[int]], new_tokens: int, device) -> float:
    """Decode tokens/s: time for N new tokens minus time for 1, over B*(N-1) tokens."""

    def timed(n: int) -> float:
        torch.cuda.synchronize() if device.type == "cuda" else None
        t0 = time.perf_counter()
        generate(bench, n)
        torch.cuda.synchronize() if device.type == "cuda" else None
        return time.perf_counter() - t0

    generate(bench, 2)  # warm-up: Triton compiles, CUDA graphs are captured
    return len(bench) * (new_tokens - 1) / (timed(new_tokens) - timed(1))


def parity(a: list[list[int]], b: list[list[int]]) -> str:
    """'same/total, mean common prefix' of two sets of greedy outputs."""

    def prefix(x: list[int], y: list[int]) -> int:
        return next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))

    same = sum(x == y for x, y in zip(a, b, strict=True))
    mean = sum(prefix(x, y) for x, y in zip(a, b, strict=True)) / len(a)
    return f"{same}/{len(a)} same, mean common prefix {mean:.1f} of {len(a[0])}"


# (attention backend, CUDA graphs, dtype, KV cache dtype): bf16 runs are timed, fp32 runs only
# check parity. An 8-bit KV cache is compared with the torch backend over the same 8-bit cache
# (the quantised oracle: same format, same tokens), never with the unquantised run.
ENGINE_RUNS = [
    ("triton", True, "bfloat16", "auto"),
    ("triton", False, "bfloat16", "auto"),
    ("torch", False, "bfloat16", "auto"),
    ("torch", True, "bfloat16", "auto"),
    ("triton", False, "float32", "auto"),
    ("torch", False, "float32", "auto"),
    ("triton", False, "bfloat16", "fp8"),
    ("torch", False, "bfloat16", "fp8"),
    ("triton", False, "float32", "int8"),
    ("torch", False, "float32", "int8"),
]
SHORT = {"bfloat16": "bf16", "float32": "fp32"}


def run_label(backend: str, graphs: bool, dtype: str, kv: str) -> str:
    """'triton + graphs bf16', 'torch fp32 kv int8': the row names of the report."""
    kv_part = "" if kv == "auto" else f" kv {kv}"
    return f"{backend}{' + graphs' if graphs else ''} {SHORT[dtype]}{kv_part}"


def settings(folder: Path, hf_model, device, dry: bool) -> list[tuple]:
    """(label, make a generate fn, time it too, the label of the run its tokens must equal:
    the torch backend in the same dtype over the same KV format) for every run of one model."""
    runs = []
    for backend, graphs, dtype, kv in ENGINE_RUNS:
        dtype = "float32" if dry else dtype  # toy CPU runs: fp32, the engine's CPU default
        label = run_label(backend, graphs, dtype, kv)
        if all(label != run[0] for run in runs):
            make = partial(engine_generate, folder, device, backend, graphs, dtype, kv)
            base = run_label("torch", False, dtype, kv)
            runs.append((label, make, dtype == "bfloat16" or dry, base))
    hf_dtype = "float32" if dry else "bfloat16"
    hf = (f"transformers {SHORT[hf_dtype]}", partial(hf_generate, hf_model, device), True)
    return runs + [(*hf, run_label("torch", False, hf_dtype, "auto"))]


def end_to_end(report: Report, device: torch.device, budget, dry: bool) -> None:
    """Every model in every engine run: decode tokens/s and parity rows, into report."""
    report.data["end to end: decode tokens/s"] = speed = []
    report.data["end to end: greedy parity against the torch backend"] = agree = []
    new_tokens, parity_tokens = (8, 8) if dry else (128, 32)
    for name, cfg in model_configs(dry).items():
        if budget() < 90:
            report.note(f"{name}: skipped, out of time")
            continue
        rng = random.Random(0)
        lens = [3, 17, 40] if dry else [3, 17, 64, 130, 257, 300, 511, 700]  # 700 > one chunk
        prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(n)] for n in lens]
        batch, plen = (4, 8) if dry else (32, 128)
        bench = [[rng.randrange(3, cfg.vocab_size) for _ in range(plen)] for _ in range(batch)]
        tokens, bases = {}, {}
        with tempfile.TemporaryDirectory() as tmp:
            hf_model = make_model(cfg, Path(tmp), device, dry)
            for label, make, timed, base in settings(Path(tmp), hf_model, device, dry):
                bases[label] = base
                row = {"model": name, "run": label}
                if budget() < 40:
                    speed.append({**row, "status": "skipped: out of time"})
                    continue
                try:
                    generate = make()
                    tokens[label] = generate(prompts, parity_tokens)
                    if timed:
                        rate = decode_rate(generate, bench, new_tokens, device)
                        speed.append({**row, "decode_tok_s": round(rate, 1)})
                except Exception as exc:  # the engine is young: report it and go on
                    speed.append({**row, "status": f"{type(exc).__name__}: {exc}"[:300]})
                finally:
                    generate = None  # drops the engine and its KV cache before the next one
                    gc.collect()
                    torch.cuda.empty_cache() if device.type == "cuda" else None
            hf_model = None
        for label, toks in tokens.items():
            base = bases[label]
            if label != base and base in tokens:
                agree.append(
                    {"model": name, "run": label, "vs": base, "tokens": parity(toks, tokens[base])}
                )
        report.write()
