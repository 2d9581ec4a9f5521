"""The suite's measurements, in the order ``minicb bench`` takes them (minicb.bench.suite):
one ``Suite`` method per section of ``bench.json`` (hardware, scheduler cost, decode
roofline, each offline workload on every system, the rate sweep, prefix caching), each
naming what it measures on the progress bar; ``count_runs`` says how many units of work
that bar will see.

Also here, as the measurement of the suite's scheduler-cost section and of its goal:
``time_schedule``, what ``schedule()`` costs on its own, timed on the real engine over a
FakeRunner (no model). What continuous batching should gain over static batching is
predicted elsewhere, by the schedulers that run: the same requests through the real engine
with each scheduler on a simulated runner (minicb.sim.run.static_vs_continuous, its limit
case ``H_B`` beside it; the bench's prediction is minicb.bench.calibration's, on a ``cpu``
profile of this machine).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from minicb.bench import (
    NO_LAB,
    RunRecord,
    aggregate,
    calibration,
    decode_steps,
    outside_model_share,
    paired_ratio,
    performance_lab,
    ratio_table,
)
from minicb.bench.recipes import MINICB, BenchPlan, sweep_workload
from minicb.bench.sanity import check_ratios
from minicb.bench.systems import Systems, compare_prefix_caching, kv_blocks_for, sibling
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.runner.fake import FakeRunner
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.cost_model.catalogue import model_shape
from minicb.cost_model.step_time import ModelShape
from minicb.telemetry.metrics import distribution
from minicb.utilisation import probes
from minicb.workload import Workload, arrival_times, describe_arrivals


def count_runs(
    plan: BenchPlan, num_workloads: int, num_cached: int = 0, roofline: bool = True
) -> int:
    """How many units of work the progress bar will see (``num_cached``: prefix-caching
    workloads, one unit per repeat and per warm-up, off and on together; ``roofline``:
    whether the performance lab's decode sweep runs)."""
    n_sys = len(plan.systems)
    warmups = n_sys * (num_workloads if plan.warmup_each_workload else 1)
    sweep_points = len(plan.loads) + (1 if plan.bursty else 0)
    return (
        2  # hardware, scheduler
        + len(plan.decode_batches) * plan.decode_rounds * roofline
        + warmups
        + num_workloads * n_sys * plan.repeats
        + sweep_points * len([s for s in plan.systems if s in MINICB])
        + num_cached * (plan.repeats + plan.warmup_each_workload)
    )


def time_schedule(
    num_running: int,
    iterations: int = 200,
    batching: str = "continuous",
    prompt_len: int = 16,
    block_size: int = 16,
    num_waiting: int = 0,
) -> dict[str, float]:
    """Seconds per ``schedule()`` with ``num_running`` requests decoding: median, mean, p90;
    ``num_waiting`` more wait behind them (every slot is taken: a demo's deep queue).

    The real engine over a FakeRunner (no model, no torch; nobody stops while measured):
    requests are admitted and prefilled until all are decoding, then each step event's
    ``schedule_s`` is read. The engine times ``schedule()`` alone, so the rest of its step
    (the runner, token bookkeeping, stop checks) stays out of the figure."""
    budget = 512
    prefill_steps = -(-num_running * prompt_len // budget) + 1
    max_tokens = iterations + prefill_steps + 8  # nobody finishes while we measure
    blocks = num_running * blocks_needed(prompt_len + max_tokens, block_size)
    config = EngineConfig(
        batching=batching, max_num_seqs=num_running, block_size=block_size, num_kv_blocks=blocks,
        max_num_batched_tokens=max(budget, num_running), num_swap_blocks=0,
    )  # fmt: skip
    runner = FakeRunner(blocks, max_model_len=prompt_len + max_tokens + 1, num_swap_blocks=0)
    engine = LLMEngine(config=config, runner=runner)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(num_running + num_waiting):
        engine.add_request([5] * prompt_len, params, arrival_time=float(i))
    times = [e.schedule_s for e in islice(decode_steps(engine, num_running), iterations)]
    if len(times) < iterations:
        raise RuntimeError(f"only {len(times)} steps had all {num_running} requests decoding")
    d = distribution(times)
    return {"num_running": num_running, "num_waiting": num_waiting, "batching": batching,
            "iterations": iterations, "median_s": d["p50"], "mean_s": d["mean"],
            "p90_s": d["p90"]}  # fmt: skip


@dataclass
class Suite:
    plan: BenchPlan
    systems: Systems
    bar: Any  # tqdm
    trace_stem: str | None

    def tick(self, what: str) -> None:
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
        self.tick("hardware: copy bandwidth, matmul FLOP/s")
        dtype, device = self.systems.continuous.runner.dtype, self.systems.continuous.runner.device
        if hw is None:
            weight_bytes = self.model_shape().streamed_params * dtype.itemsize
            nbytes = probes.copy_bytes(weight_bytes)
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
        return model_shape(self.systems.continuous.runner.model_path)

    def scheduler_cost(self) -> list[dict[str, float]]:
        self.tick("scheduler cost")
        out = [time_schedule(n, self.plan.sched_iterations) for n in self.plan.sched_sizes]
        self.bar.update()
        return out

    def decode_roofline(self, hw: dict[str, Any]) -> dict[str, Any]:
        """The decode roofline sweep: the performance lab's (perflab.roofline), run where
        it sits beside the package; otherwise the section says where to find it."""
        lab = performance_lab("roofline")
        if lab is None:
            return {"skipped": NO_LAB, "points": []}
        return lab.decode_roofline(self, hw)

    # ---- the workloads -------------------------------------------------------------------
    def workload(self, w: Workload, warm: bool) -> dict[str, Any]:
        names = list(self.plan.systems)
        if warm:
            head = w.head(self.plan.max_num_seqs, max_tokens=8)
            for name in names:
                self.tick(f"{w.name}: warm-up {name}")
                self.systems.run(name, head)
                self.bar.update()
        probe = self.calibration_probe(w.name) if set(calibration.PAIR) <= set(names) else None
        runs: dict[str, list[RunRecord]] = {n: [] for n in names}
        for r in range(self.plan.repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                self.tick(f"{w.name}: {name}, repeat {r + 1}/{self.plan.repeats}")
                trace = self._trace_path(w.name, name) if r == 0 and name in MINICB else None
                runs[name].append(self.systems.run(name, w, trace))
                self.bar.update()
        check_ratios(w, runs, self.plan.max_num_seqs)  # before any ratio is made or judged
        return {
            "definition": w.describe(),
            "figures": {n: aggregate(recs) for n, recs in runs.items()},
            "errors": {n: recs[0].error for n, recs in runs.items() if recs[0].error},
            "ratios": ratio_table(runs),
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
        self.tick(f"{what}: decode and chunk-step probe for the calibration")
        p, pairs = self.plan, max(8, 2 * self.plan.decode_steps)  # 16 at full size
        per_req = blocks_needed(p.decode_prompt + 2 * pairs + 6, p.block_size)
        narrow = sibling(self.systems.continuous, max_num_seqs=1, num_kv_blocks=per_req + 1)
        wide = sibling(self.systems.continuous, num_kv_blocks=(p.max_num_seqs + 1) * per_req)
        return calibration.probe_steps(narrow, wide, p.decode_prompt, pairs)

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
                self.tick(f"sweep {wl.arrivals}: {name}")
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
            self.tick(f"{w.name}: warm-up, caching off and on")
            compare_prefix_caching(engine, w.head(p.max_num_seqs, 8), num_kv_blocks=blocks)
            self.bar.update()
        runs: dict[str, list[RunRecord]] = {"off": [], "on": []}
        for r in range(p.repeats):
            self.tick(f"{w.name}: caching off and on, repeat {r + 1}/{p.repeats}")
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
