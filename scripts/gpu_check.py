"""GPU check: the kernel tests on CUDA, decode-attention bandwidth, end-to-end engine figures.

Run from the repository root of a CUDA machine; nothing needs installing, no network, no
weights (the models are random, in real shapes):

    PYTHONPATH=. python scripts/gpu_check.py [OUT_DIR]      # OUT_DIR: $OUT, else ./gpu_check_out
    python scripts/gpu_check.py --dry-run                    # toy sizes on CPU: checks the script

Sections, in order, each skipped when the time budget (--budget-s) runs short:
  1. environment     versions, device
  2. kernel tests    pytest tests/kernels on CUDA, in parallel shards (Triton compiles on
                     the CPU cores); without pytest, the same matrix through a built-in sweep
  3. bandwidth       a large tensor copy gives the device's practical bandwidth; the decode
                     kernel's bytes of K/V read per second are set against it
  4. end to end      random-weight SmolLM2-135M and Qwen2-0.5B shapes: greedy tokens of the
                     triton and torch backends and of transformers' generate compared, and
                     decode tokens/s with and without CUDA graphs (bf16; fp32 runs only
                     check parity). Decode tokens/s is B*(N-1) / (t(N tokens) - t(1 token)),
                     so prefill time cancels out.
gpu_check.json and gpu_check.md are rewritten after every section, so a run cut short
still leaves what it measured. Without CUDA (and without --dry-run) it says so, exits 0.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRY = "--dry-run" in sys.argv
# Triton reads TRITON_INTERPRET once, at import: decide before anything imports it.
if DRY or shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


class Report:
    """Figures by section; rewritten to JSON and markdown after every section."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.data: dict = {}
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        print(text, flush=True)
        self.notes.append(text)

    def write(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        payload = {**self.data, "notes": self.notes}
        (self.out_dir / "gpu_check.json").write_text(json.dumps(payload, indent=2))
        lines = ["# minicb GPU check", ""]
        for section, rows in self.data.items():
            lines += [f"## {section}", ""] + _markdown(rows) + [""]
        lines += ["## notes", ""] + [f"- {n}" for n in self.notes]
        (self.out_dir / "gpu_check.md").write_text("\n".join(lines) + "\n")


def _markdown(rows) -> list[str]:
    """A list of flat dicts becomes a table; a dict becomes key: value lines."""
    if isinstance(rows, dict):
        return [f"- {k}: {v}" for k, v in rows.items()]
    if not rows:
        return ["(none)"]
    keys = list(dict.fromkeys(k for row in rows for k in row))
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in map(row.get, keys)]
        out.append("| " + " | ".join("" if c == "None" else c for c in cells) + " |")
    return out


def median_time(fn, device: torch.device, iters: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()``; CUDA events on a GPU, wall clock on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


# ---- 1. environment ------------------------------------------------------------------------
def environment(device: torch.device) -> dict:
    import transformers
    import triton

    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            name=props.name,
            sms=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
        )
    return env


# ---- 2. kernel tests -------------------------------------------------------------------------
def kernel_tests(report: Report, timeout_s: float, shards: int) -> dict:
    """pytest tests/kernels split over parallel processes, so Triton compiles overlap."""
    if importlib.util.find_spec("pytest") is None:
        report.note("pytest is not installed: kernels checked by the built-in sweep instead")
        return kernel_sweep()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    listed = subprocess.run(
        base + ["--collect-only", "tests/kernels"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ids = [line for line in listed.stdout.splitlines() if "::" in line]
    if DRY:
        ids = ids[:6]  # the sharding itself is what a dry run checks
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            base + ids[i::shards],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(min(shards, len(ids)))
    ]
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    logs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            report.note("a kernel-test shard ran out of time and was killed")
            counts["error"] += 1
        logs.append(out)
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        for n, what in re.findall(r"(\d+) (passed|failed|error|skipped)", summary):
            counts[what] += int(n)
    (report.out_dir / "kernel_tests.log").write_text("\n\n".join(logs))
    return {"collected": len(ids), **counts, "wall_s": round(time.perf_counter() - t0, 1)}


def kernel_sweep() -> dict:
    """Without pytest: the main matrix of the kernel tests, run here with their builders."""
    from minicb.kernels import reference
    from minicb.kernels.triton_backend import TritonBackend
    from tests.kernels import GQA_SHAPES, TOLERANCES, make_paged_case

    t0, cases, failures = time.perf_counter(), 0, []
    batches = {"decode": ([1, 1, 1], [1, 37, 300]), "prefill": ([70, 45, 1], [70, 200, 33])}
    matrix = itertools.product(GQA_SHAPES, (64, 128), (16, 32), TOLERANCES, batches.items())
    for (heads, kv_heads), dim, block, dtype, (kind, lens) in matrix:
        query, k_cache, v_cache, meta = make_paged_case(*lens, heads, kv_heads, dim, block, dtype)
        out = TritonBackend().attention(query, k_cache, v_cache, meta, dim**-0.5)
        ref = reference.paged_attention(query, k_cache, v_cache, meta, dim**-0.5)
        atol, rtol = TOLERANCES[dtype]
        cases += 1
        if not torch.allclose(out.float(), ref.float(), atol=atol, rtol=rtol):
            failures.append(f"{kind} {heads}:{kv_heads} D={dim} block={block} {dtype}")
    return {
        "runner": "built-in sweep (no pytest here)",
        "cases": cases,
        "failed": len(failures),
        "failures": "; ".join(failures[:6]),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


# ---- 3. bandwidth ----------------------------------------------------------------------------
def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """GB/s of a large device copy, counting the bytes read and the bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = median_time(lambda: dst.copy_(src), device, iters=10)
    return 2 * nbytes / seconds / 1e9


def decode_bandwidth(device, batch, ctx, heads, kv_heads, head_dim, num_splits=None) -> dict:
    """Time the decode kernel on a scattered paged cache; check it against the reference."""
    from minicb.kernels import reference
    from minicb.kernels.decode_attention import default_num_splits, paged_decode_attention
    from minicb.kernels.metadata import AttentionMetadata

    dtype, block_size = torch.bfloat16, 16
    per_req = -(-ctx // block_size)
    tables = torch.randperm(batch * per_req, device=device).to(torch.int32).view(batch, per_req)
    k_cache = torch.randn(
        (batch * per_req, block_size, kv_heads, head_dim), dtype=dtype, device=device
    )
    v_cache = torch.randn_like(k_cache)
    query = torch.randn((batch, heads, head_dim), dtype=dtype, device=device)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    splits = num_splits or default_num_splits(batch, kv_heads, ctx, device)

    def run():
        return paged_decode_attention(
            query, k_cache, v_cache, tables, lens, head_dim**-0.5, ctx, num_splits=splits
        )

    seconds = median_time(run, device, iters=3 if DRY else 20)
    meta = AttentionMetadata(
        torch.empty(0, dtype=torch.int64, device=device),
        tables,
        lens,
        torch.arange(batch + 1, dtype=torch.int32, device=device),
        1,
        ctx,
        [1] * batch,
        [ctx] * batch,
    )

    def ref_run():
        return reference.paged_decode_attention(query, k_cache, v_cache, meta, head_dim**-0.5)

    ref_seconds = median_time(ref_run, device, iters=3, warmup=1)
    err = (run().float() - ref_run().float()).abs().max().item()
    kv_bytes = 2 * batch * ctx * kv_heads * head_dim * k_cache.element_size()
    return {
        "shape": f"B={batch} ctx={ctx} H={heads}/{kv_heads} D={head_dim}",
        "splits": splits,
        "kv_MB": round(kv_bytes / 1e6, 1),
        "us": round(seconds * 1e6, 1),
        "GB_s": round(kv_bytes / seconds / 1e9, 1),
        "ref_us": round(ref_seconds * 1e6, 1),
        "max_abs_err": err,
    }


def bandwidth(device: torch.device) -> list[dict]:
    if DRY:
        shapes = [(2, 100, 4, 1, 64, None), (1, 300, 4, 1, 64, 3)]
        copy_bytes = 2**20
    else:
        shapes = [
            (64, 4096, 32, 8, 128, None),  # Llama-8B-like heads, 1 GB of K/V
            (256, 2048, 9, 3, 64, None),  # SmolLM2-135M heads
            (2, 32768, 32, 8, 128, 1),  # long context, few requests: no split ...
            (2, 32768, 32, 8, 128, None),  # ... and the split chosen by default
        ]
        copy_bytes = 2**31
    copy_gbs = copy_bandwidth(device, copy_bytes)
    rows = [{"shape": "tensor copy (read + write)", "GB_s": round(copy_gbs, 1)}]
    for *shape, splits in shapes:
        row = decode_bandwidth(device, *shape, num_splits=splits)
        row["of_copy_bw"] = f"{row['GB_s'] / copy_gbs:.0%}"
        rows.append(row)
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return rows


# ---- 4. end to end ---------------------------------------------------------------------------
def model_configs() -> dict:
    from transformers import LlamaConfig, Qwen2Config

    if DRY:
        tiny = dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=256,
        )
        return {"tiny-llama": LlamaConfig(**tiny, tie_word_embeddings=True)}
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


def make_model(cfg, folder: Path, device: torch.device):
    """A seeded random model in cfg's shape, saved to folder; returned for transformers' run."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    dtype = torch.float32 if DRY else torch.bfloat16
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


def engine_generate(folder: Path, device, backend: str, graphs: bool, dtype: str):
    """minicb's LLM as ``fn(prompts, n) -> new tokens``; the engine lives in the closure."""
    from minicb import LLM, SamplingParams

    llm = LLM(
        model=str(folder),
        dtype=dtype,
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


# (attention backend, CUDA graphs, dtype): bf16 runs are timed, fp32 runs only check parity.
ENGINE_RUNS = [
    ("triton", True, "bfloat16"),
    ("triton", False, "bfloat16"),
    ("torch", False, "bfloat16"),
    ("torch", True, "bfloat16"),
    ("triton", False, "float32"),
    ("torch", False, "float32"),
]
SHORT = {"bfloat16": "bf16", "float32": "fp32"}


def settings(folder: Path, hf_model, device) -> list[tuple]:
    """(label, make a generate fn, time it too) for every run of one model."""
    runs = []
    for backend, graphs, dtype in ENGINE_RUNS:
        dtype = "float32" if DRY else dtype  # toy CPU runs: fp32, the engine's CPU default
        label = f"{backend}{' + graphs' if graphs else ''} {SHORT[dtype]}"
        if all(label != run[0] for run in runs):
            make = partial(engine_generate, folder, device, backend, graphs, dtype)
            runs.append((label, make, dtype == "bfloat16" or DRY))
    hf_label = f"transformers {'fp32' if DRY else 'bf16'}"
    return runs + [(hf_label, partial(hf_generate, hf_model, device), True)]


def end_to_end(report: Report, device: torch.device, budget) -> None:
    report.data["end to end: decode tokens/s"] = speed = []
    report.data["end to end: greedy parity against the torch backend"] = agree = []
    new_tokens, parity_tokens = (8, 8) if DRY else (128, 32)
    for name, cfg in model_configs().items():
        if budget() < 90:
            report.note(f"{name}: skipped, out of time")
            continue
        rng = random.Random(0)
        lens = [3, 17, 40] if DRY else [3, 17, 64, 130, 257, 300, 511, 700]  # 700 > one chunk
        prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(n)] for n in lens]
        batch, plen = (4, 8) if DRY else (32, 128)
        bench = [[rng.randrange(3, cfg.vocab_size) for _ in range(plen)] for _ in range(batch)]
        tokens = {}
        with tempfile.TemporaryDirectory() as tmp:
            hf_model = make_model(cfg, Path(tmp), device)
            for label, make, timed in settings(Path(tmp), hf_model, device):
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
            base = "torch fp32" if "fp32" in label else "torch bf16"
            if label != base and base in tokens:
                agree.append(
                    {"model": name, "run": label, "vs": base, "tokens": parity(toks, tokens[base])}
                )
        report.write()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", nargs="?", default=os.environ.get("OUT") or "gpu_check_out")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on CPU")
    parser.add_argument(
        "--budget-s", type=float, default=450.0, help="stop starting sections after"
    )
    parser.add_argument("--shards", type=int, default=8, help="parallel kernel-test processes")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    report = Report(Path(args.out_dir))
    if not torch.cuda.is_available() and not args.dry_run:
        print(
            "gpu_check: no CUDA device here; nothing to measure. "
            "Use --dry-run to exercise the script on CPU at toy sizes."
        )
        return 0
    device = torch.device("cpu" if args.dry_run else "cuda")
    t0 = time.perf_counter()

    def budget() -> float:
        return args.budget_s - (time.perf_counter() - t0)

    report.data["environment"] = environment(device)
    report.write()
    if not args.skip_tests:
        shards = 2 if args.dry_run else args.shards
        report.data["kernel tests"] = kernel_tests(report, min(240.0, budget() - 120), shards)
        report.write()
    report.data["decode attention bandwidth (bf16, block 16)"] = bandwidth(device)
    report.write()
    try:
        end_to_end(report, device, budget)
    except ImportError as exc:
        report.note(f"end to end skipped, the engine API is not importable: {exc}")
    report.data["total_s"] = {"wall": round(time.perf_counter() - t0, 1)}
    report.write()
    print((report.out_dir / "gpu_check.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
