"""``minicb bench``: the whole benchmark, in order: hardware, scheduler cost, decode
roofline, the offline workloads on every system, latency against request rate, then the
prefix-caching workloads on minicb continuous with caching off and on.

Every system is warmed up before it is measured. Within each repeat the systems run one
after another in an order that rotates from repeat to repeat, so a slow spell on the
machine falls on all of them alike; figures are medians over the repeats, with min and max.
It prints markdown tables and writes ``bench.json``, ``bench.md`` and a self-contained
``bench.html`` to ``--out-dir``. docs/performance.md describes every workload and figure.
This file is the command (its arguments, the plan, the order, the outputs); each
measurement is a method of ``Suite`` (minicb.bench.measurements).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from minicb.bench import calibration, performance_lab
from minicb.bench.measurements import Suite, count_runs
from minicb.bench.recipes import (
    FULL,
    MINICB,
    QUICK,
    SYSTEMS,
    BenchPlan,
    cache_workloads,
    make_workloads,
)
from minicb.bench.systems import (
    Systems,
    build_systems,
)
from minicb.core.config import DTYPES
from minicb.core.runner.loader import load_hf_config, resolve_model_path
from minicb.cost_model.catalogue import model_shape
from minicb.engine_options import describe_choices


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark batching modes and transformers")
    p.add_argument("--quick", action="store_true", help="small workloads, one repeat")
    p.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2-135M)")
    p.add_argument(
        "--dtype", default="auto", choices=DTYPES,
        help="auto: bfloat16 where the hardware computes it natively, else float32",
    )  # fmt: skip
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    p.add_argument(
        "--compile", default="off", choices=("off", "on"),
        help="minicb's decode steps as one compiled graph (the performance lab's, perflab/: "
        "a source checkout, run from its root; minutes to build at the start)",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch threads, pinned (default 1: on a shared 2-core machine two threads stall)",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=None, help="measured repeats per system")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=None, metavar="SYSTEM",
                   help=f"{' '.join(SYSTEMS)} (default: all)")  # fmt: skip
    p.add_argument("--ttft-slo", type=float, default=None, metavar="S", help="goodput TTFT target")
    p.add_argument("--tpot-slo", type=float, default=None, metavar="S", help="goodput TPOT target")
    p.add_argument("--out-dir", default="artifacts/bench", help="where bench.json/.html go")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--trace", metavar="FILE", default=None,
        help="record each minicb run (first repeat) as FILE-stem.<workload>.<system>.jsonl, "
        "for `minicb replay` and the visualizer",
    )  # fmt: skip
    p.add_argument(
        "--simulate", metavar="GPU:MODEL", default=None,
        help="run the papers' reproductions on the simulated runner instead (no model, no "
        "GPU; docs/reproductions.md); GPU:MODEL (e.g. H100:llama-3.1-8b) is the profile of "
        "the at-scale static/continuous comparison",
    )  # fmt: skip
    p.add_argument(
        "--speculative", default=None, choices=("ngram", "draft", "early_exit"),
        help="instead: speculation off against on at batch 1, 4 and 16, with the break-even "
        "rule (minicb.bench.speculative; --draft-model, --draft-layers for its proposer)",
    )  # fmt: skip
    p.add_argument("--draft-model", default=None, help="with --speculative draft")
    p.add_argument("--draft-layers", type=int, default=None, help="with --speculative early_exit")
    p.add_argument("--reproduce", nargs="+", default=None, metavar="NAME",
                   help="with --simulate: anyscale vllm sarathi scale (default: all)")  # fmt: skip
    p.set_defaults(func=run)


def run_simulated_bench(args: argparse.Namespace) -> int:
    """``--simulate``: the reproductions, printed as markdown and written as
    reproductions.json/.md/.html to ``--out-dir``."""
    from minicb.bench.all_reproductions import REPRODUCTIONS, render, render_html, run_all

    size = 0.25 if args.quick else 1.0
    results = run_all(args.reproduce or list(REPRODUCTIONS), args.simulate, size)
    markdown = render(results)
    print(markdown)
    write_outputs(Path(args.out_dir), "reproductions", results, markdown, render_html)
    print("(SIMULATED)")
    return 0


def make_plan(args: argparse.Namespace) -> BenchPlan:
    for name in ("repeats", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be at least 1, got {value}")
    keys = ("repeats", "ttft_slo", "tpot_slo")
    changes = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    if args.systems:  # in the suite's order, whatever the order given
        changes["systems"] = tuple(s for s in SYSTEMS if s in args.systems)
    return replace(QUICK if args.quick else FULL, **changes)


def run_speculative_bench(args: argparse.Namespace) -> int:
    """``--speculative PROPOSER``: minicb.bench.speculative with this command's options."""
    from minicb.bench import speculative

    out = Path(args.out_dir) / "speculative.json"
    argv = ["--proposer", args.speculative, "--device", args.device, "--dtype", args.dtype,
            "--threads", str(args.threads), "--out", str(out)]  # fmt: skip
    optional = {"--model": args.model, "--repeats": args.repeats,
                "--draft-model": args.draft_model, "--draft-layers": args.draft_layers}  # fmt: skip
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    return speculative.main(argv + (["--quick"] if args.quick else []))


def run(args: argparse.Namespace) -> int:
    if args.simulate:
        return run_simulated_bench(args)
    if args.speculative:
        return run_speculative_bench(args)
    import torch
    from tqdm import tqdm

    from minicb.bench.charts import render_html
    from minicb.bench.report import evaluate, render

    plan, started = make_plan(args), time.time()
    torch.set_num_threads(args.threads)  # before any model is built
    vocab = load_hf_config(resolve_model_path(args.model)).vocab_size
    workloads = make_workloads(plan, vocab)
    cached = cache_workloads(plan, vocab) if MINICB[0] in plan.systems else []
    systems = build_systems(
        args.model, plan, workloads, dtype=args.dtype, device=args.device, compile=args.compile
    )
    print(f"minicb bench: {describe_choices(systems.continuous.describe()['runner'])}")
    roofline = performance_lab("roofline") is not None
    total = count_runs(plan, len(workloads), len(cached), roofline)
    with tqdm(total=total, unit="run", file=sys.stderr, disable=args.no_progress) as bar:
        suite = Suite(plan, systems, bar, args.trace)
        results: dict[str, Any] = {"meta": _meta(args, plan, systems, started)}
        hw = results["hardware"] = suite.hardware()
        results["scheduler"] = suite.scheduler_cost()
        results["roofline"] = suite.decode_roofline(hw)  # measures ``hw`` again afterwards
        results["workloads"] = {
            w.name: suite.workload(w, warm=plan.warmup_each_workload or i == 0)
            for i, w in enumerate(workloads)
        }
        head = results["workloads"][workloads[0].name]["figures"].get("minicb-continuous")
        capacity = head["req_s"]["median"] if head and head.get("req_s") else None
        results["rate_sweep"] = suite.rate_sweep(vocab, capacity)
        results["prefix_caching"] = {w.name: suite.prefix_caching(w) for w in cached}
    engine = systems.continuous  # the simulated runner's cpu profile against these runs
    shape = model_shape(str(resolve_model_path(args.model)))
    results["calibration"] = calibration.calibrate(
        results, workloads, engine.config, shape, engine.runner.dtype.itemsize
    )
    results["goals"] = evaluate(results, headline=workloads[0].name, control="fixed")
    results["meta"]["duration_s"] = time.time() - started
    markdown = render(results) + calibration.render(results["calibration"])
    print(markdown)
    write_outputs(Path(args.out_dir), "bench", results, markdown, render_html)
    return 0


def write_outputs(
    out: Path, stem: str, results: dict, markdown: str, render_html: Callable[[dict, str], str]
) -> None:
    """``stem``.json, .md and .html (the offline plotly page) in ``out``, and say where."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.{ext}" for ext in ("json", "md", "html")]
    paths[0].write_text(json.dumps(results, indent=1), encoding="utf-8")
    paths[1].write_text(markdown, encoding="utf-8")
    paths[2].write_text(render_html(results, markdown), encoding="utf-8")
    print(f"\nwrote {paths[0]}, {paths[1]} and {paths[2]}")


def _meta(args: argparse.Namespace, plan: BenchPlan, systems: Systems, started: float) -> dict:
    from importlib import metadata

    import torch

    runner = systems.continuous.describe()["runner"]
    return {
        "command": "minicb bench" + (" --quick" if args.quick else ""),
        "argv": sys.argv[1:], "quick": plan.quick, "model": systems.continuous.model_name,
        "dtype": runner["dtype"], "dtype_reason": runner["dtype_reason"],
        "compile": runner["compile"],
        "device": runner["device"], "threads": torch.get_num_threads(),
        "max_num_seqs": plan.max_num_seqs, "repeats": plan.repeats, "ttft_slo": plan.ttft_slo,
        "tpot_slo": plan.tpot_slo, "num_kv_blocks": systems.num_kv_blocks,
        "hf_error": systems.hf_error, "plan": asdict(plan), "started": started,
        "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "versions": {p: metadata.version(p) for p in ("torch", "transformers")},
    }  # fmt: skip
