"""Calibration: does the simulated runner's step-time model predict the real engine here?

The ``cpu`` profile is the step-time model (minicb/runner/step_time.py) of this machine:
the copy bandwidth and matmul FLOP/s the bench measured (``hardware``), efficiency 1
(they are rates reached, not datasheet peaks), and a fixed step overhead read off one
other measurement of the same run, a batch-1 decode probe taken just before each workload
(``calibration_probe``; the roofline's batch-1 point where there is none): its median
step time less the profile's memory/compute time for that step. Nothing is fitted to the
workloads it is then judged on:

- per step: every step of minicb continuous and static on each workload, predicted from
  its rows (step_row's totals) against its measured wall time; the median relative error;
- the ratio: each workload replayed through the real engine over a ``SimulatedRunner`` of
  the ``cpu`` profile with the same configs, continuous/static throughput, against the
  measured (paired) ratio.

Targets (issue 15): within 25 % per step (median), 10 % on the ratio. Figures to report,
not pass/fail tests. Pure Python: no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from minicb.bench import STEP_TOTALS
from minicb.bench.bench_plan import MINICB_CONFIGS
from minicb.bench.driver import run_minicb
from minicb.bench.workloads import Workload
from minicb.config import EngineConfig
from minicb.engine import LLMEngine
from minicb.runner import VirtualClock
from minicb.runner.simulated import SimulatedRunner
from minicb.runner.step_time import Efficiency, GPUSpec, ModelShape, StepTimeModel

PAIR = ("minicb-continuous", "minicb-static")
STEP_TARGET, RATIO_TARGET = 0.25, 0.10


def cpu_profile(
    hw: dict[str, Any], shape: ModelShape, elem_bytes: int, probe: dict[str, Any]
) -> StepTimeModel:
    """This machine as a step-time model; ``probe`` is the roofline's batch-1 point."""
    gpu = GPUSpec("cpu", memory_bytes=0.0, bandwidth=hw["copy_bandwidth"], flops=hw["matmul_flops"])
    base = StepTimeModel(gpu, shape, Efficiency(1.0, 1.0, 1.0, 0.0, 0.0), elem_bytes)
    rows = [(1, round(probe["context"]), True)] * probe["batch"]
    roofline = base.terms(rows)["step_s"]
    overhead = max(0.0, probe["step_s"] - roofline)
    return replace(base, efficiency=replace(base.efficiency, step_overhead_s=overhead))


def step_errors(profile: StepTimeModel, steps: list[dict[str, float]]) -> dict[str, float | None]:
    """Predicted over measured, minus 1, per step: median, median of |.|, 90th of |.|."""
    errors = [
        profile.totals_terms(*(int(s[k]) for k in STEP_TOTALS))["step_s"] / s["dt"] - 1
        for s in steps
        if s["dt"] > 0
    ]
    if not errors:
        return {"n": 0, "median": None, "median_abs": None, "p90_abs": None}
    absolute = sorted(abs(e) for e in errors)
    return {
        "n": len(errors),
        "median": statistics.median(errors),
        "median_abs": statistics.median(absolute),
        "p90_abs": absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))],
    }


def simulated_ratio(profile: StepTimeModel, config: EngineConfig, w: Workload) -> float | None:
    """Continuous over static output tokens/s, the workload run on the profile."""
    tok_s = {}
    for name in PAIR:
        cfg = config.with_(**MINICB_CONFIGS[name])
        clock = VirtualClock()
        engine = LLMEngine(
            config=cfg, runner=SimulatedRunner(profile, cfg, clock=clock), clock=clock
        )
        tok_s[name] = run_minicb(engine, w, name, sleep=clock.advance).figures["output_tok_s"]
    return tok_s[PAIR[0]] / tok_s[PAIR[1]] if tok_s[PAIR[1]] else None


def calibrate(
    results: dict[str, Any], workloads: list[Workload], config: EngineConfig, shape: ModelShape,
    elem_bytes: int,
) -> dict[str, Any] | None:  # fmt: skip
    """The ``cpu`` profile and its errors on every workload that ran both systems and has
    a batch-1 probe (its own, else the roofline's); None when none has."""
    points = {p["batch"]: p for p in results.get("roofline", {}).get("points", [])}
    out: dict[str, Any] = {}
    for w in workloads:
        res = results["workloads"][w.name]
        probe = res.get("calibration_probe") or points.get(1)
        if probe is None or not all(n in res["runs"] for n in PAIR):
            continue
        profile = cpu_profile(results["hardware"], shape, elem_bytes, probe)
        steps = [s for n in PAIR for r in res["runs"][n] for s in r["steps"]]
        measured = (res["ratios"].get(f"{PAIR[0]} / {PAIR[1]}") or {}).get("median")
        predicted = simulated_ratio(profile, config, w)
        out[w.name] = {
            "step_overhead_s": profile.efficiency.step_overhead_s,
            "step_error": step_errors(profile, steps),
            "measured_ratio": measured,
            "predicted_ratio": predicted,
            "ratio_error": predicted / measured - 1 if measured and predicted else None,
        }
    if not out:
        return None
    hw = results["hardware"]
    return {"profile": {"bandwidth": hw["copy_bandwidth"], "flops": hw["matmul_flops"]},
            "targets": {"step": STEP_TARGET, "ratio": RATIO_TARGET}, "workloads": out}  # fmt: skip


def render(cal: dict[str, Any] | None) -> str:
    """The calibration as a markdown section."""
    if not cal:
        head = "\n## Calibration of the simulated runner\n\n"
        return head + "Not run (it needs minicb continuous and static).\n"
    p = cal["profile"]
    lines = [
        "", "## Calibration of the simulated runner (`cpu` profile)", "",
        f"Profile: {p['bandwidth'] / 1e9:.1f} GB/s, {p['flops'] / 1e9:.0f} GFLOP/s, and a step "
        "overhead per workload (a batch-1 decode probe just before it, less its roofline). "
        "Targets: per-step median error within 25 %, continuous/static within 10 %.",
        "", "| workload | overhead | steps | median error | median abs error | p90 abs "
        "| measured ratio | predicted ratio | ratio error |", "|---" * 9 + "|",
    ]  # fmt: skip
    for name, c in cal["workloads"].items():
        e = c["step_error"]
        lines.append(
            f"| {name} | {c['step_overhead_s'] * 1000:.0f} ms | {e['n']} | {_pct(e['median'])} | "
            f"{_pct(e['median_abs'])} | {_pct(e['p90_abs'])} | {_num(c['measured_ratio'])} | "
            f"{_num(c['predicted_ratio'])} | {_pct(c['ratio_error'])} |"
        )
    return "\n".join(lines) + "\n"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.0f} %"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
