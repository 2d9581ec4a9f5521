"""``minicb bench``: the whole benchmark, in order: hardware, scheduler cost, decode
roofline, the offline workloads on every system, latency against request rate, then the
prefix-caching workloads on minicb continuous with caching off and on.

Every system is warmed up before it is measured. Within each repeat the systems run one
after another in an order that rotates from repeat to repeat, so a slow spell on the
machine falls on all of them alike; figures are medians over the repeats, with min and max.
It prints markdown tables and writes ``bench.json``, ``bench.md`` and a self-contained
``bench.html`` to ``--out-dir``. docs/performance.md describes every workload and figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from minicb.bench import (
    RunRecord,
    aggregate,
    calibration,
    outside_model_share,
    paired_ratio,
    ratio_table,
    theory,
)
from minicb.bench.arrivals import arrival_times, describe_arrivals
from minicb.bench.bench_plan import (
    FULL,
    MINICB,
    QUICK,
    SYSTEMS,
    BenchPlan,
    cache_workloads,
    make_workloads,
    sweep_workload,
)
from minicb.bench.systems import (
    Systems,
    build_systems,
    compare_prefix_caching,
    kv_blocks_for,
    sibling,
)
from minicb.bench.workloads import Workload
from minicb.config import DTYPES, describe_choices
from minicb.runner import probes
from minicb.runner.catalogue import model_shape
from minicb.runner.loader import load_hf_config, resolve_model_path
from minicb.runner.step_time import ModelShape
from minicb.scheduler.block_manager import blocks_needed


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
    p.add_argument("--reproduce", nargs="+", default=None, metavar="NAME",
                   help="with --simulate: anyscale vllm sarathi scale (default: all)")  # fmt: skip
    p.set_defaults(func=run)


def run_simulated_bench(args: argparse.Namespace) -> int:
    """``--simulate``: the reproductions, printed as markdown and written as
    reproductions.json/.md/.html to ``--out-dir``."""
    from minicb.bench.reproduction_report import render, render_html
    from minicb.bench.reproductions import REPRODUCTIONS, run_all

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


def run(args: argparse.Namespace) -> int:
    if args.simulate:
        return run_simulated_bench(args)
    import torch
    from tqdm import tqdm

    from minicb.bench.report import evaluate, render, render_html

    plan, started = make_plan(args), time.time()
    torch.set_num_threads(args.threads)  # before any model is built
    vocab = load_hf_config(resolve_model_path(args.model)).vocab_size
    workloads = make_workloads(plan, vocab)
    cached = cache_workloads(plan, vocab) if MINICB[0] in plan.systems else []
    systems = build_systems(args.model, args.dtype, args.device, plan, workloads)
    print(f"minicb bench: {describe_choices(systems.continuous.describe()['runner'])}")
    total = count_runs(plan, len(workloads), len(cached))
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
        "device": runner["device"], "threads": torch.get_num_threads(),
        "max_num_seqs": plan.max_num_seqs, "repeats": plan.repeats, "ttft_slo": plan.ttft_slo,
        "tpot_slo": plan.tpot_slo, "num_kv_blocks": systems.num_kv_blocks,
        "hf_error": systems.hf_error, "plan": asdict(plan), "started": started,
        "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "versions": {p: metadata.version(p) for p in ("torch", "transformers")},
    }  # fmt: skip


def count_runs(plan: BenchPlan, num_workloads: int, num_cached: int = 0) -> int:
    """How many units of work the progress bar will see (``num_cached``: prefix-caching
    workloads, one unit per repeat and per warm-up, off and on together)."""
    n_sys = len(plan.systems)
    warmups = n_sys * (num_workloads if plan.warmup_each_workload else 1)
    sweep_points = len(plan.loads) + (1 if plan.bursty else 0)
    return (
        2  # hardware, scheduler
        + len(plan.decode_batches) * plan.decode_rounds
        + warmups
        + num_workloads * n_sys * plan.repeats
        + sweep_points * len([s for s in plan.systems if s in MINICB])
        + num_cached * (plan.repeats + plan.warmup_each_workload)
    )


@dataclass
class Suite:
    plan: BenchPlan
    systems: Systems
    bar: Any  # tqdm
    trace_stem: str | None

    def _tick(self, what: str) -> None:
        self.bar.set_postfix_str(what, refresh=True)

    def _trace_path(self, *parts: str) -> str | None:
        if not self.trace_stem:
            return None
        stem = Path(self.trace_stem)
        base = stem.with_suffix("") if stem.suffix == ".jsonl" else stem
        base.parent.mkdir(parents=True, exist_ok=True)
        return str(base.with_name(".".join([base.name, *parts, "jsonl"])))

    # ---- the machine ---------------------------------------------------------------------
    def hardware(self, hw: dict[str, Any] | None = None) -> dict[str, Any]:
        """Copy bandwidth and matmul FLOP/s, best of 5 each. Measured at the start and again
        after the decode sweep, into the first measurement ``hw`` (same sizes): other work
        on a shared machine can only lower a figure, so the higher of the two is the limit."""
        self._tick("hardware: copy bandwidth, matmul FLOP/s")
        dtype, device = self.systems.continuous.runner.dtype, self.systems.continuous.runner.device
        if hw is None:
            nbytes = probes.copy_bytes(self.model_sizes()["weight_bytes"])
            hw = {"copy_bytes": nbytes, "matmul_n": probes.matmul_size(dtype, device=device),
                  "copy_bandwidth_samples": [], "matmul_flops_samples": []}  # fmt: skip
            self.bar.update()
        for key, value in (
            ("copy_bandwidth", probes.measure_copy_bandwidth(hw["copy_bytes"], device=device)),
            ("matmul_flops", probes.measure_matmul_flops(dtype, hw["matmul_n"], device=device)),
        ):
            hw[f"{key}_samples"].append(value)
            hw[key] = max(hw[f"{key}_samples"])
        return hw

    def model_shape(self) -> ModelShape:
        """The model's shape, read from its config.json as the step-time model reads it."""
        return model_shape(str(self.systems.continuous.runner.files.path))

    def model_sizes(self) -> dict[str, int]:
        return theory.model_sizes(self.model_shape(), self.systems.continuous.runner.dtype.itemsize)

    def scheduler_cost(self) -> list[dict[str, float]]:
        self._tick("scheduler cost")
        out = [theory.time_schedule(n, self.plan.sched_iterations) for n in self.plan.sched_sizes]
        self.bar.update()
        return out

    def decode_roofline(self, hw: dict[str, Any]) -> dict[str, Any]:
        """Pure decode steps at each batch size, minicb and padded generate alternating;
        each figure is the median over the rounds of each round's median step."""
        p = self.plan
        top, args = max(p.decode_batches), (p.decode_prompt, p.decode_warm, p.decode_steps)
        per_req = blocks_needed(sum(args) + 2, p.block_size)
        engine = sibling(self.systems.continuous, max_num_seqs=top, num_kv_blocks=top * per_req + 1)
        hf = self.systems.hf_model if "hf-padded" in p.systems else None
        ours: dict[int, list[dict[str, float]]] = {b: [] for b in p.decode_batches}
        linears: dict[int, list[float]] = {b: [] for b in p.decode_batches}
        theirs: dict[int, list[float]] = {b: [] for b in p.decode_batches}
        batches = list(p.decode_batches)
        for r in range(p.decode_rounds):
            k = r % len(batches)
            for b in batches[k:] + batches[:k]:
                self._tick(f"decode at batch {b}, round {r + 1}/{p.decode_rounds}")
                ours[b].append(theory.time_decode(engine, b, *args))
                linears[b].append(theory.time_linears(engine.runner.model, b))
                if hf is not None:  # transformers' padded generate, same prompts and steps
                    try:
                        theirs[b].append(theory.time_hf_decode(hf, b, *args))
                    except Exception:  # its column stays empty; the workloads say why
                        hf = None
                self.bar.update()
        self.hardware(hw)
        shape, elem = self.model_shape(), engine.runner.dtype.itemsize
        points = []
        for b, rounds in ours.items():
            steps = [m["step_s"] for m in rounds]
            measured = {"step_s": statistics.median(steps), "step_s_min": min(steps),
                        "step_s_max": max(steps),
                        "forward_s": statistics.median(m["forward_s"] for m in rounds),
                        "context": statistics.fmean(m["context"] for m in rounds),
                        "linears_s": statistics.median(linears[b])}  # fmt: skip
            point = theory.roofline_point(measured, shape, elem, b, hw)
            if theirs[b]:
                point["hf_step_s"] = statistics.median(theirs[b])
                point["hf_tok_s"] = b / point["hf_step_s"]
            points.append(point)
        sizes = theory.model_sizes(shape, elem)
        return {"sizes": sizes, "prompt_len": p.decode_prompt, "points": points}

    # ---- the workloads -------------------------------------------------------------------
    def workload(self, w: Workload, warm: bool) -> dict[str, Any]:
        names = list(self.plan.systems)
        if warm:
            head = w.head(self.plan.max_num_seqs, max_tokens=8)
            for name in names:
                self._tick(f"{w.name}: warm-up {name}")
                self.systems.run(name, head)
                self.bar.update()
        probe = self.calibration_probe(w.name) if set(calibration.PAIR) <= set(names) else None
        runs: dict[str, list[RunRecord]] = {n: [] for n in names}
        for r in range(self.plan.repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                self._tick(f"{w.name}: {name}, repeat {r + 1}/{self.plan.repeats}")
                trace = self._trace_path(w.name, name) if r == 0 and name in MINICB else None
                runs[name].append(self.systems.run(name, w, trace))
                self.bar.update()
        return {
            "definition": w.describe(),
            "figures": {n: aggregate(recs) for n, recs in runs.items()},
            "errors": {n: recs[0].error for n, recs in runs.items() if recs[0].error},
            "ratios": ratio_table(runs),
            "theory": self.theory(w, runs),
            "outside_model": {
                n: outside_model_share([s for r in runs[n] for s in r.steps])
                for n in names
                if n in MINICB
            },
            "runs": {n: [asdict(r) for r in recs] for n, recs in runs.items()},
            "calibration_probe": probe,
        }

    def calibration_probe(self, what: str) -> dict[str, Any]:
        """Batch-1 decode steps in turn with decode steps of ``max_num_seqs - 1`` rows
        and mixed ones (calibration.probe_steps), just before a workload: the simulated
        runner's cpu profile reads its FLOP rate, step overhead and chunk-step cost off
        them, so a change in the shared machine's load since the roofline sweep does not
        pass for a model error."""
        self._tick(f"{what}: decode and chunk-step probe for the calibration")
        p, pairs = self.plan, max(8, 2 * self.plan.decode_steps)  # 16 at full size
        per_req = blocks_needed(p.decode_prompt + 2 * pairs + 6, p.block_size)
        narrow = sibling(self.systems.continuous, max_num_seqs=1, num_kv_blocks=per_req + 1)
        wide = sibling(self.systems.continuous, num_kv_blocks=(p.max_num_seqs + 1) * per_req)
        return calibration.probe_steps(narrow, wide, p.decode_prompt, pairs)

    def theory(self, w: Workload, runs: dict[str, list[RunRecord]]) -> dict[str, Any] | None:
        pair = MINICB[:2]  # the model predicts continuous against unsorted static
        if not all(n in runs for n in pair):
            return None
        model = theory.fit_step_model([s for n in pair for r in runs[n] for s in r.steps])
        p = self.plan
        pred = theory.predict(
            w.prompt_lens, w.output_lens, p.max_num_seqs, p.max_num_batched_tokens, model
        )
        measured = paired_ratio(runs["minicb-continuous"], runs["minicb-static"])
        return {
            "step_model": model.to_dict(),
            "predicted": pred,
            "measured_ratio": measured,
            "measured_wall_s": {n: statistics.median(r.wall_s for r in runs[n]) for n in pair},
            "relative_error": measured["median"] / pred["ratio"] - 1 if measured else None,
        }

    def rate_sweep(self, vocab: int, capacity: float | None) -> list[dict[str, Any]]:
        """Poisson (and one bursty) arrivals at fractions of ``capacity`` (req/s)."""
        p = self.plan
        names = [n for n in p.systems if n in MINICB]
        if not capacity or not names:
            return []
        base = sweep_workload(p, vocab)
        points = [(x, 1.0) for x in p.loads] + ([p.bursty] if p.bursty else [])
        out = []
        for i, (load, burst) in enumerate(points):
            rate = round(load * capacity, 3)
            times = arrival_times(len(base.requests), rate, burst, seed=p.seed + 2)
            wl = base.with_arrivals(times, describe_arrivals(rate, burst, p.seed + 2))
            for name in names[i % len(names) :] + names[: i % len(names)]:
                self._tick(f"sweep {wl.arrivals}: {name}")
                trace = self._trace_path(f"load{load:g}-b{burst:g}", name)
                rec = self.systems.run(name, wl, trace)
                out.append(
                    {"load": load, "rate": rate, "burstiness": burst, "arrivals": wl.arrivals,
                     "system": name, "figures": rec.figures, "error": rec.error}
                )  # fmt: skip
                self.bar.update()
        return out

    # ---- prefix caching ------------------------------------------------------------------
    def prefix_caching(self, w: Workload) -> dict[str, Any]:
        """``w`` on minicb continuous with prefix caching off and on: siblings sharing its
        weights, a fresh pool each run (sized so nothing is preempted), the order rotating
        from repeat to repeat; the on/off throughput ratio is paired by repeat."""
        p, engine = self.plan, self.systems.continuous
        slo = (p.ttft_slo, p.tpot_slo)
        blocks = kv_blocks_for([w], p.max_num_seqs, p.block_size)
        if p.warmup_each_workload:
            self._tick(f"{w.name}: warm-up, caching off and on")
            compare_prefix_caching(engine, w.head(p.max_num_seqs, 8), num_kv_blocks=blocks)
            self.bar.update()
        runs: dict[str, list[RunRecord]] = {"off": [], "on": []}
        for r in range(p.repeats):
            self._tick(f"{w.name}: caching off and on, repeat {r + 1}/{p.repeats}")
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            traces = {k: self._trace_path(w.name, f"minicb-cache-{k}") for k in order}
            pair = compare_prefix_caching(
                engine, w, slo, order, traces if r == 0 else None, num_kv_blocks=blocks
            )
            for k, rec in pair.items():
                runs[k].append(rec)
            self.bar.update()
        return {
            "definition": w.describe(),
            "num_kv_blocks": blocks,
            "figures": {k: aggregate(recs) for k, recs in runs.items()},
            "on_over_off": paired_ratio(runs["on"], runs["off"]),
            "runs": {k: [asdict(r) for r in recs] for k, recs in runs.items()},
        }
