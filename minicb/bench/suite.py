"""The whole benchmark, in order: hardware, scheduler cost, decode roofline, the offline
workloads on every system, then latency against request rate.

Every system is warmed up before it is measured. Within each repeat the systems run one
after another in an order that rotates from repeat to repeat, so a slow spell on the
machine falls on all of them alike; figures are medians over the repeats, with min and max.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from minicb.bench import roofline, sched_cost
from minicb.bench.arrivals import arrival_times, describe_arrivals
from minicb.bench.figures import aggregate, figures_of, paired_ratio, ratio_table
from minicb.bench.hf_padded import time_hf_decode
from minicb.bench.presets import BenchPlan, sweep_workload
from minicb.bench.records import RunRecord
from minicb.bench.systems import Systems
from minicb.bench.theory import fit_step_model, predict
from minicb.bench.workloads import Workload
from minicb.scheduler.block_manager import blocks_needed

MINICB = ("minicb-continuous", "minicb-static")


def count_runs(plan: BenchPlan, num_workloads: int) -> int:
    """How many units of work the progress bar will see."""
    n_sys = len(plan.systems)
    warmups = n_sys * (num_workloads if plan.warmup_each_workload else 1)
    sweep_points = len(plan.loads) + (1 if plan.bursty else 0)
    return (
        2  # hardware, scheduler
        + len(plan.decode_batches) * plan.decode_rounds
        + warmups
        + num_workloads * n_sys * plan.repeats
        + sweep_points * len([s for s in plan.systems if s in MINICB])
    )


class Suite:
    def __init__(self, plan: BenchPlan, systems: Systems, bar: Any, trace: str | None) -> None:
        self.plan, self.systems, self.bar = plan, systems, bar
        self.trace_stem = trace

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
    def hardware(self, before: dict[str, Any] | None = None) -> dict[str, Any]:
        """Copy bandwidth and matmul FLOP/s, best of 5 each. Measured at the start and again
        after the decode sweep (``before`` is the first measurement): other work on a
        shared machine can only lower a figure, so the higher of the two is the limit."""
        self._tick("hardware: copy bandwidth, matmul FLOP/s")
        runner = self.systems.continuous.runner
        nbytes = min(1 << 30, max(256 << 20, 2 * self.model_sizes()["weight_bytes"]))
        bw = roofline.measure_copy_bandwidth(nbytes)
        flops = roofline.measure_matmul_flops(runner.dtype, 2048)
        hw: dict[str, Any] = {
            "copy_bytes": nbytes,
            "matmul_n": 2048,
            "copy_bandwidth_samples": [*(before or {}).get("copy_bandwidth_samples", []), bw],
            "matmul_flops_samples": [*(before or {}).get("matmul_flops_samples", []), flops],
        }
        hw["copy_bandwidth"] = max(hw["copy_bandwidth_samples"])
        hw["matmul_flops"] = max(hw["matmul_flops_samples"])
        if before is None:
            self.bar.update()
        return hw

    def model_sizes(self) -> dict[str, int]:
        runner = self.systems.continuous.runner
        elem = runner.kv_cache.element_size()
        return roofline.model_sizes(runner.model, runner.model_config, elem)

    def scheduler_cost(self) -> list[dict[str, float]]:
        self._tick("scheduler cost")
        out = [
            sched_cost.time_schedule(n, self.plan.sched_iterations) for n in self.plan.sched_sizes
        ]
        self.bar.update()
        return out

    def decode_roofline(self, hw: dict[str, float]) -> dict[str, Any]:
        """Pure decode steps at each batch size, minicb and padded generate alternating;
        each figure is the median over the rounds of each round's median step."""
        p = self.plan
        top = max(p.decode_batches)
        per_req = blocks_needed(p.decode_prompt + p.decode_warm + p.decode_steps + 2, p.block_size)
        engine = self.systems.sibling(max_num_seqs=top, num_kv_blocks=top * per_req + 1)
        hf = self.systems.hf_model if "hf-padded" in p.systems else None
        ours: dict[int, list[dict[str, float]]] = {b: [] for b in p.decode_batches}
        theirs: dict[int, list[float]] = {b: [] for b in p.decode_batches}
        batches = list(p.decode_batches)
        for r in range(p.decode_rounds):
            k = r % len(batches)
            for b in batches[k:] + batches[:k]:
                self._tick(f"decode at batch {b}, round {r + 1}/{p.decode_rounds}")
                args = (b, p.decode_prompt, p.decode_warm, p.decode_steps)
                ours[b].append(roofline.time_decode(engine, *args))
                if hf is not None:  # transformers' padded generate, same prompts and steps
                    try:
                        theirs[b].append(time_hf_decode(hf, *args)["step_s"])
                    except Exception:  # its column stays empty; the workloads say why
                        hf = None
                self.bar.update()
        hw = self.hardware(before=hw)
        sizes, cfg = self.model_sizes(), engine.runner.model_config
        points = []
        for b in batches:
            steps = [m["step_s"] for m in ours[b]]
            measured = {
                "step_s": statistics.median(steps),
                "step_s_min": min(steps),
                "step_s_max": max(steps),
                "forward_s": statistics.median(m["forward_s"] for m in ours[b]),
                "context": statistics.fmean(m["context"] for m in ours[b]),
            }
            point = roofline.roofline_point(measured, sizes, cfg, b, hw)
            if theirs[b]:
                point["hf_step_s"] = statistics.median(theirs[b])
                point["hf_tok_s"] = b / point["hf_step_s"]
            points.append(point)
        return {"sizes": sizes, "prompt_len": p.decode_prompt, "points": points, "hardware": hw}

    # ---- the workloads -------------------------------------------------------------------
    def warm_up(self, workload: Workload) -> None:
        head = workload.head(min(len(workload.requests), self.plan.max_num_seqs), max_tokens=8)
        for name in self.plan.systems:
            self._tick(f"{workload.name}: warm-up {name}")
            self.systems.run(name, head)
            self.bar.update()

    def workload(self, w: Workload, warm: bool) -> dict[str, Any]:
        if warm:
            self.warm_up(w)
        names = list(self.plan.systems)
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
            "errors": {n: recs[0].error for n, recs in runs.items() if recs and recs[0].error},
            "ratios": ratio_table(runs),
            "theory": self.theory(w, runs),
            "outside_model": {
                n: sched_cost.outside_model_share([s for r in runs[n] for s in r.steps])
                for n in names
                if n in MINICB
            },
            "runs": {n: [r.to_dict() for r in recs] for n, recs in runs.items()},
        }

    def theory(self, w: Workload, runs: dict[str, list[RunRecord]]) -> dict[str, Any] | None:
        if not all(n in runs for n in MINICB):
            return None
        steps = [s for n in MINICB for r in runs[n] for s in r.steps]
        model = fit_step_model(steps)
        p = self.plan
        pred = predict(
            w.prompt_lens, w.output_lens, p.max_num_seqs, p.max_num_batched_tokens, model
        )
        measured = paired_ratio(runs["minicb-continuous"], runs["minicb-static"])
        walls = {n: statistics.median(r.wall_s for r in runs[n]) for n in MINICB}
        error = measured["median"] / pred["ratio"] - 1 if measured else None
        return {
            "step_model": model.to_dict(),
            "predicted": pred,
            "measured_ratio": measured,
            "measured_wall_s": walls,
            "relative_error": error,
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
                     "system": name, "figures": figures_of(rec), "error": rec.error}
                )  # fmt: skip
                self.bar.update()
        return out
