"""The goals ``minicb bench`` judges (issue 14's): continuous over static against its
prediction (the real schedulers on the simulated runner's ``cpu`` profile, sim/calibration.py),
three ratios to transformers on the headline and the control, the decode roofline at batch
1 and 32 (with what the linear layers alone reach), and ``schedule()``'s cost.

A goal is a figure to report, not a pass/fail test: a missed goal says by how much. The
report (minicb.bench.report) prints them as a table.
"""

from __future__ import annotations

from typing import Any

from minicb.bench import median_of


def _goal(
    name: str, measured: float | None, target: float, unit: str = "", lower_is_better: bool = False
) -> dict[str, Any]:
    goal = {"goal": name, "target": target, "measured": measured, "met": None}
    if measured is None:
        return {**goal, "note": "not measured"}
    met = measured <= target if lower_is_better else measured >= target
    gap = abs(measured / target - 1) * 100 if target else 0.0
    note = f"missed by {gap:.0f} % ({measured:.3g}{unit} against {target:.3g}{unit})"
    return {**goal, "met": met, "note": "met" if met else note}


def _ratio(results: dict[str, Any], workload: str, other: str) -> float | None:
    ratios = results["workloads"].get(workload, {}).get("ratios", {})
    return median_of(ratios.get(f"minicb-continuous / {other}"))


def evaluate(results: dict[str, Any], headline: str, control: str) -> list[dict[str, Any]]:
    """The goals (issue 14's): the prediction, three ratios to transformers, the roofline at
    batch 1 and 32, schedule()."""
    cal = (results.get("calibration") or {}).get("workloads", {}).get(headline) or {}
    err = cal.get("ratio_error")
    name = f"{headline}: continuous/static within 15 % of the prediction"
    goals = [_goal(name, None if err is None else abs(err), 0.15, lower_is_better=True)]
    if err is not None:
        goals[0]["note"] = (
            f"measured {cal['measured_ratio']:.2f} vs predicted {cal['predicted_ratio']:.2f} "
            f"(the real schedulers on the simulated cpu): off by {abs(err) * 100:.0f} %"
        )
        if not goals[0]["met"]:
            goals[0]["note"] += f", {(abs(err) - 0.15) * 100:.0f} points beyond the 15 % allowed"
    for name, workload, other, target in (
        (f"{headline}: minicb continuous >= 1.5x hf-continuous (generate_batch)", headline,
         "hf-continuous", 1.5),
        (f"{headline}: minicb continuous >= 2x hf padded generate", headline, "hf-padded", 2.0),
        (f"{control}: minicb continuous >= hf padded generate", control, "hf-padded", 1.0),
    ):  # fmt: skip
        goals.append(_goal(name, _ratio(results, workload, other), target, "x"))
    points = {p["batch"]: p for p in results.get("roofline", {}).get("points", [])}
    s256 = {s["num_running"]: s["median_s"] * 1000 for s in results.get("scheduler", [])}
    return goals + [
        _roofline_goal(points.get(1), 1, 0.60),
        _roofline_goal(points.get(32), 32, 0.70),
        _goal("schedule() with 256 running < 0.5 ms (median)", s256.get(256), 0.5, " ms", True),
    ]


def _roofline_goal(point: dict[str, Any] | None, batch: int, target: float) -> dict[str, Any]:
    """The goal, and how much of the ceiling the linear layers alone reach: a goal above
    that is out of reach of any engine on this matmul library."""
    name = f"decode at batch {batch} >= {target * 100:.0f} % of the hardware ceiling"
    goal = _goal(name, point and point["fraction"], target)
    bound = point and point.get("linears_fraction")
    if bound is not None:
        goal["note"] += f"; the linear layers alone reach {bound * 100:.0f} %"
    return goal
