"""The goals the suite reports against, each measured, compared and explained in words.

Goals are figures to report, not pass/fail tests: a missed goal says by how much.
"""

from __future__ import annotations

from typing import Any


def _median(results: dict[str, Any], workload: str, system: str, key: str) -> float | None:
    fig = results["workloads"].get(workload, {}).get("figures", {}).get(system) or {}
    cell = fig.get(key)
    return cell["median"] if cell else None


def _ratio(results: dict[str, Any], workload: str, pair: str) -> float | None:
    cell = results["workloads"].get(workload, {}).get("ratios", {}).get(pair)
    return cell["median"] if cell else None


def _goal(
    name: str, measured: float | None, target: float, unit: str, lower_is_better: bool = False
):
    if measured is None:
        return {
            "goal": name,
            "target": target,
            "measured": None,
            "met": None,
            "note": "not measured",
        }
    met = measured <= target if lower_is_better else measured >= target
    gap = (measured / target - 1) * 100 if target else 0.0
    note = (
        "met"
        if met
        else f"missed by {abs(gap):.0f} % ({measured:.3g}{unit} against {target:.3g}{unit})"
    )
    return {"goal": name, "target": target, "measured": measured, "met": met, "note": note}


def evaluate(results: dict[str, Any], headline: str, control: str) -> list[dict[str, Any]]:
    goals = []
    theory = results["workloads"].get(headline, {}).get("theory") or {}
    err = theory.get("relative_error")
    g = _goal(
        f"{headline}: continuous/static within 15 % of theory",
        abs(err) if err is not None else None,
        0.15,
        "",
        lower_is_better=True,
    )
    if err is not None:
        g["note"] = (
            f"measured {theory['measured_ratio']['median']:.2f} vs predicted "
            f"{theory['predicted']['ratio']:.2f}: off by {abs(err) * 100:.0f} %"
            + (
                ""
                if g["met"]
                else f", {(abs(err) - 0.15) * 100:.0f} points beyond the 15 % allowed"
            )
        )
    goals.append(g)
    goals.append(
        _goal(
            f"{headline}: minicb continuous >= 3x hf-continuous (generate_batch)",
            _ratio(results, headline, "minicb-continuous / hf-continuous"),
            3.0,
            "x",
        )
    )
    goals.append(
        _goal(
            f"{headline}: minicb continuous >= 2x hf padded generate",
            _ratio(results, headline, "minicb-continuous / hf-padded"),
            2.0,
            "x",
        )
    )
    goals.append(
        _goal(
            f"{control}: minicb continuous >= hf padded generate",
            _ratio(results, control, "minicb-continuous / hf-padded"),
            1.0,
            "x",
        )
    )
    points = {p["batch"]: p for p in results.get("roofline", {}).get("points", [])}
    at32 = points.get(32)
    goals.append(
        _goal("decode at batch 32 >= 60 % of the hardware ceiling",
              at32["fraction"] if at32 else None, 0.60, "")
    )  # fmt: skip
    sched = {s["num_running"]: s for s in results.get("scheduler", [])}
    s256 = sched.get(256)
    goals.append(
        _goal("schedule() with 256 running < 0.5 ms (median)",
              s256["median_s"] * 1000 if s256 else None, 0.5, " ms", lower_is_better=True)
    )  # fmt: skip
    return goals
