"""``minicb bench``: minicb continuous and static against transformers, on seeded workloads.

Prints markdown tables, writes ``bench.json`` and a self-contained ``bench.html`` to
``--out-dir``. ``--quick`` takes a minute or two on a 2-core CPU; the full run 15 to 25
minutes. docs/performance.md describes every workload and figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from minicb.config import DTYPES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark batching modes and transformers")
    p.add_argument("--quick", action="store_true", help="small workloads, one repeat")
    p.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2-135M)")
    p.add_argument("--dtype", default="bfloat16", choices=[d for d in DTYPES if d != "auto"])
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads, pinned (default 1: on a shared 2-core machine two threads stall)",
    )
    p.add_argument("--repeats", type=int, default=None, help="measured repeats per system")
    p.add_argument(
        "--systems", nargs="+", default=None, metavar="SYSTEM",
        help="minicb-continuous minicb-static hf-padded hf-continuous (default: all)",
    )  # fmt: skip
    p.add_argument("--ttft-slo", type=float, default=None, metavar="S", help="goodput TTFT target")
    p.add_argument("--tpot-slo", type=float, default=None, metavar="S", help="goodput TPOT target")
    p.add_argument("--out-dir", default="artifacts/bench", help="where bench.json/.html go")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--trace", metavar="FILE", default=None,
        help="record each minicb run (first repeat) as FILE-stem.<workload>.<system>.jsonl, "
        "for `minicb replay` and the visualizer",
    )  # fmt: skip
    p.set_defaults(func=run)


def make_plan(args: argparse.Namespace):
    from minicb.bench.presets import FULL, QUICK, SYSTEMS

    plan = QUICK if args.quick else FULL
    changes: dict[str, Any] = {}
    if args.repeats is not None:
        if args.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
        changes["repeats"] = args.repeats
    if args.systems:
        unknown = sorted(set(args.systems) - set(SYSTEMS))
        if unknown:
            raise ValueError(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
        changes["systems"] = tuple(s for s in SYSTEMS if s in args.systems)
    if args.ttft_slo is not None:
        changes["ttft_slo"] = args.ttft_slo
    if args.tpot_slo is not None:
        changes["tpot_slo"] = args.tpot_slo
    return plan.with_(**changes)


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from minicb.bench.goals import evaluate
    from minicb.bench.presets import make_workloads
    from minicb.bench.report_html import render_html
    from minicb.bench.report_md import render
    from minicb.bench.suite import Suite, count_runs
    from minicb.bench.systems import build_systems
    from minicb.runner.loader import load_hf_config, resolve_model_path

    if args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    torch.set_num_threads(args.threads)  # before any model is built
    plan = make_plan(args)
    started = time.time()
    vocab = load_hf_config(resolve_model_path(args.model)).vocab_size
    workloads = make_workloads(plan, vocab)
    systems = build_systems(args.model, args.dtype, args.device, plan, workloads)
    total = count_runs(plan, len(workloads))
    with tqdm(total=total, unit="run", file=sys.stderr, disable=args.no_progress) as bar:
        suite = Suite(plan, systems, bar, args.trace)
        results: dict[str, Any] = {"meta": _meta(args, plan, systems, started)}
        results["hardware"] = suite.hardware()
        results["scheduler"] = suite.scheduler_cost()
        results["roofline"] = suite.decode_roofline(results["hardware"])
        results["hardware"] = results["roofline"].pop("hardware")  # both measurements
        results["workloads"] = {}
        for i, w in enumerate(workloads):
            warm = plan.warmup_each_workload or i == 0
            results["workloads"][w.name] = suite.workload(w, warm)
        head = results["workloads"][workloads[0].name]["figures"].get("minicb-continuous")
        capacity = head["req_s"]["median"] if head and head.get("req_s") else None
        results["rate_sweep"] = suite.rate_sweep(vocab, capacity)
    results["goals"] = evaluate(results, headline=workloads[0].name, control="fixed")
    results["meta"]["duration_s"] = time.time() - started
    markdown = render(results)
    print(markdown)
    _write(args.out_dir, results, markdown, render_html(results, markdown))
    return 0


def _write(out_dir: str, results: dict[str, Any], markdown: str, page: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    (out / "bench.md").write_text(markdown, encoding="utf-8")
    (out / "bench.html").write_text(page, encoding="utf-8")
    print(f"\nwrote {out / 'bench.json'}, {out / 'bench.md'} and {out / 'bench.html'}")


def _meta(args: argparse.Namespace, plan: Any, systems: Any, started: float) -> dict[str, Any]:
    from dataclasses import asdict
    from importlib import metadata

    import torch

    runner = systems.continuous.runner
    return {
        "command": "minicb bench" + (" --quick" if args.quick else ""),
        "argv": sys.argv[1:],
        "quick": plan.quick,
        "model": systems.continuous.model_name,
        "dtype": str(runner.dtype).removeprefix("torch."),
        "device": str(runner.device),
        "threads": torch.get_num_threads(),
        "max_num_seqs": plan.max_num_seqs,
        "repeats": plan.repeats,
        "ttft_slo": plan.ttft_slo,
        "tpot_slo": plan.tpot_slo,
        "num_kv_blocks": systems.num_kv_blocks,
        "hf_error": systems.hf_error,
        "plan": asdict(plan),
        "started": started,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": {p: metadata.version(p) for p in ("torch", "transformers")},
    }
