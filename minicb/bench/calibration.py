"""Calibration: does the simulated runner's step-time model predict the real engine here?

The ``cpu`` profile is the step-time model (minicb/cost_model/step_time.py) of this machine:
the copy bandwidth and matmul FLOP/s the bench measured (``hardware``), memory and compute
added rather than overlapped (one core does both in turn), and three figures read off a
probe of the same engine taken just before each workload (``probe_steps``; the roofline's
batch-1 point alone where there is none: efficiency 1, no chunk-step cost):

- the FLOP efficiency: the slope of the step time from a batch-1 decode to a decode of
  ``max_num_seqs - 1`` rows, less the memory term's own slope, is the time the extra
  rows' FLOPs take: the share of the square-matmul rate the model's narrow matmuls reach;
- the step overhead: the batch-1 decode step less its memory and compute time;
- the chunk-step cost, paid by every step with a prompt chunk (the torch attention then
  makes one masked SDPA call per chunk in every layer): a prompt chunk joining those decode
  rows, less the step's predicted time.

Nothing is fitted to the workloads it is then judged on:

- per step: every step of minicb continuous and static on each workload, predicted from
  its rows (step_row's totals) against its measured wall time; the median relative error,
  over all steps and per kind (``step_kind``: decode, prefill, mixed);
- the ratio: each workload replayed through the real engine over a ``SimulatedRunner`` of
  the ``cpu`` profile with the same configs, continuous/static throughput, against the
  measured (paired) ratio. This is the bench's prediction of static against continuous
  batching (``predict_workload``: the real schedulers, not a model of them), and the goal
  ``minicb bench`` judges it by (minicb.bench.report).

Targets (issue 15): within 25 % per step (median), 10 % on the ratio. Figures to report,
not pass/fail tests. Pure Python: no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from minicb.bench import run_minicb
from minicb.bench.recipes import MINICB_CONFIGS
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.runner import VirtualClock
from minicb.cost_model.step_time import Efficiency, GPUSpec, ModelShape, StepTimeModel
from minicb.sim.markdown_table import markdown_table
from minicb.sim.simulated_runner import SimulatedRunner
from minicb.sim.step_rows import STEP_TOTALS, step_row
from minicb.workload import Workload

PAIR = ("minicb-continuous", "minicb-static")
STEP_TARGET, RATIO_TARGET = 0.25, 0.10
KINDS = ("decode", "prefill", "mixed")


def probe_steps(narrow: LLMEngine, wide: LLMEngine, prompt_len: int, pairs: int) -> dict[str, Any]:
    """The probe the ``cpu`` profile reads: ``narrow`` decodes one request while ``wide``
    decodes ``max_num_seqs - 1``, and every other step ``wide`` takes in a prompt of
    ``prompt_len`` tokens that ends after its first token; the two engines step in turn,
    so a change in the machine's load falls on both alike. The batch-1 point (``step_s``,
    its median; ``context``) and ``steps``: ``wide``'s step rows, ``pairs`` pure decode
    steps and as many mixed ones (the decode rows' own prompts left out)."""
    long = SamplingParams(max_tokens=2 * pairs + 4, temperature=0.0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for engine, n in ((narrow, 1), (wide, max(1, wide.config.max_num_seqs - 1))):
        for i in range(n):  # distinct prompts, so no two requests are alike
            engine.add_request([3 + (7 * i + j) % 200 for j in range(prompt_len)], long)
        while any(r.num_tokens > 1 for r in engine.step().event.plan.scheduled):
            pass  # the decode rows' prompts
    batch1, steps = [], []
    for k in range(2 * pairs):
        batch1.append(narrow.step().event)
        if k % 2 == 0:
            wide.add_request([5 + (11 * k + j) % 200 for j in range(prompt_len)], one)
        event = wide.step().event
        steps.append(step_row(event, event.wall_start))
    for engine in (narrow, wide):
        engine.abort_all()
        while engine.has_unfinished():
            engine.step()
    return {
        "batch": 1,
        "step_s": statistics.median(e.wall_end - e.wall_start for e in batch1),
        "context": statistics.fmean(e.plan.scheduled[0].context_len for e in batch1),
        "steps": steps,
    }


def step_kind(s: dict[str, float]) -> str:
    """decode (one-token rows only), prefill (prompt chunks only) or mixed (both)."""
    if not s["prefill_tokens"]:
        return "decode"
    return "mixed" if s["decode_rows"] else "prefill"


def predict(profile: StepTimeModel, s: dict[str, float]) -> float:
    """Predicted seconds of a step row."""
    totals = (int(s[k]) for k in STEP_TOTALS)
    return profile.totals_terms(*totals, chunk=step_kind(s) != "decode")["step_s"]


def cpu_profile(
    hw: dict[str, Any], shape: ModelShape, elem_bytes: int, probe: dict[str, Any]
) -> StepTimeModel:
    """This machine as a step-time model; ``probe``: a batch-1 decode point (``step_s``,
    ``context``) and, optionally, ``steps``: the rows of ``probe_steps``."""
    gpu = GPUSpec("cpu", memory_bytes=0.0, bandwidth=hw["copy_bandwidth"], flops=hw["matmul_flops"])
    eff = Efficiency(1.0, 1.0, 1.0, 0.0, 0.0, overlap=False)
    base = StepTimeModel(gpu, shape, eff, elem_bytes)
    one = base.terms([(1, round(probe["context"]), True)] * probe["batch"])
    steps = probe.get("steps") or []
    decode = [s for s in steps if step_kind(s) == "decode"]
    if decode:  # the rows' FLOPs take the slope, less the memory term's own slope
        wide = _median_step(decode)
        terms = base.totals_terms(*(int(wide[k]) for k in STEP_TOTALS))
        slope_s = wide["dt"] - probe["step_s"] - (terms["memory_s"] - one["memory_s"])
        if slope_s > 0:  # no faster than the square matmul (a noisy slope can look so)
            eff = replace(eff, flops=min(1.0, (terms["compute_s"] - one["compute_s"]) / slope_s))
    eff = replace(eff, step_overhead_s=max(0.0, probe["step_s"] - one["memory_s"]
                                           - one["compute_s"] / eff.flops))  # fmt: skip
    profile = replace(base, efficiency=eff)
    mixed = [s["dt"] - predict(profile, s) for s in steps if step_kind(s) == "mixed"]
    if mixed:
        eff = replace(eff, chunk_step_s=max(0.0, statistics.median(mixed)))
    return replace(base, efficiency=eff)


def _median_step(steps: list[dict[str, float]]) -> dict[str, float]:
    return sorted(steps, key=lambda s: s["dt"])[(len(steps) - 1) // 2]


def step_errors(profile: StepTimeModel, steps: list[dict[str, float]]) -> dict[str, Any]:
    """Predicted over measured, minus 1, per step: median, median of |.|, 90th of |.|, and
    the median and count per step kind."""
    errors = [(step_kind(s), predict(profile, s) / s["dt"] - 1) for s in steps if s["dt"] > 0]
    by_kind = {k: [e for kind, e in errors if kind == k] for k in KINDS}
    kinds = {k: {"n": len(v), "median": statistics.median(v) if v else None}
             for k, v in by_kind.items()}  # fmt: skip
    if not errors:
        return {"n": 0, "median": None, "median_abs": None, "p90_abs": None, "kinds": kinds}
    absolute = sorted(abs(e) for _, e in errors)
    return {
        "n": len(errors),
        "median": statistics.median(e for _, e in errors),
        "median_abs": statistics.median(absolute),
        "p90_abs": absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))],
        "kinds": kinds,
    }


def predict_workload(profile: StepTimeModel, config: EngineConfig, w: Workload) -> dict[str, Any]:
    """The prediction: the workload through the real engine with the continuous and the
    static scheduler on a ``SimulatedRunner`` of ``profile``; each one's simulated seconds
    (``wall_s``) and ``ratio``, continuous over static output tokens/s (None without
    static tokens)."""
    tok_s, wall_s = {}, {}
    for name in PAIR:
        cfg = config.with_(**MINICB_CONFIGS[name])
        clock = VirtualClock()
        engine = LLMEngine(
            config=cfg, runner=SimulatedRunner(profile, cfg, clock=clock), clock=clock
        )
        figures = run_minicb(engine, w, name, sleep=clock.advance).figures
        tok_s[name], wall_s[name] = figures["output_tok_s"], figures["wall_s"]
    ratio = tok_s[PAIR[0]] / tok_s[PAIR[1]] if tok_s[PAIR[1]] else None
    return {"wall_s": wall_s, "ratio": ratio}


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
        prediction = predict_workload(profile, config, w)
        predicted = prediction["ratio"]
        out[w.name] = {
            "step_overhead_s": profile.efficiency.step_overhead_s,
            "flop_rate": profile.efficiency.flops * profile.gpu.flops,
            "chunk_step_s": profile.efficiency.chunk_step_s,
            "step_error": step_errors(profile, steps),
            "measured_ratio": measured,
            "predicted_ratio": predicted,
            "predicted_wall_s": prediction["wall_s"],
            "measured_wall_s": {
                n: (res["figures"][n].get("wall_s") or {}).get("median") for n in PAIR
            },  # fmt: skip
            "ratio_error": predicted / measured - 1 if measured and predicted else None,
        }
    if not out:
        return None
    hw = results["hardware"]
    return {"profile": {"bandwidth": hw["copy_bandwidth"], "flops": hw["matmul_flops"]},
            "targets": {"step": STEP_TARGET, "ratio": RATIO_TARGET}, "workloads": out}  # fmt: skip


def render(cal: dict[str, Any] | None) -> str:
    """The calibration as a markdown section: the errors, then the median error per kind."""
    if not cal:
        head = "\n## Calibration of the simulated runner\n\n"
        return head + "Not run (it needs minicb continuous and static).\n"
    p = cal["profile"]
    lines = [
        "", "## Calibration of the simulated runner (`cpu` profile)", "",
        f"Profile: {p['bandwidth'] / 1e9:.1f} GB/s, {p['flops'] / 1e9:.0f} GFLOP/s (the square "
        "matmul probe), memory and compute added; per workload, off a probe just before it: "
        "the FLOP rate the model's matmuls reach (decode from 1 to max_num_seqs - 1 rows), "
        "the step overhead (the batch-1 decode less its roofline) and the cost of a step "
        "with a prompt chunk (a chunk joining the decode rows, less its prediction). "
        "Targets: per-step median error within 25 %, continuous/static within 10 %.",
        "",
    ]  # fmt: skip
    header = ["workload", "FLOP rate", "overhead", "chunk step", "steps", "median error",
              "median abs error", "p90 abs", "measured ratio", "predicted ratio",
              "ratio error"]  # fmt: skip
    rows, by_kind = [], []
    for name, c in cal["workloads"].items():
        e = c["step_error"]
        rows.append([
            name, f"{c['flop_rate'] / 1e9:.0f} GFLOP/s", _ms(c["step_overhead_s"]),
            _ms(c["chunk_step_s"]), str(e["n"]), _pct(e["median"]), _pct(e["median_abs"]),
            _pct(e["p90_abs"]), _num(c["measured_ratio"]), _num(c["predicted_ratio"]),
            _pct(c["ratio_error"]),
        ])  # fmt: skip
        kinds = e["kinds"]
        by_kind.append([name, *(f"{_pct(kinds[k]['median'])} ({kinds[k]['n']})" for k in KINDS)])
    lines += [
        *markdown_table(header, rows),
        "", "Median error per step kind (steps): decode (one-token rows only), prefill "
        "(prompt chunks only), mixed (both).", "",
        *markdown_table(["workload", *KINDS], by_kind),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.0f} %"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
