"""What the demo's utilisation chart shows for the real engine: static against continuous.

Builds the demo exactly as ``minicb demo`` does (its engines, its workload feeder, the same
defaults; any demo option may be passed), runs its engine loop with no browser for
``--rounds`` rounds, and summarises the step events' ``bandwidth_util`` and ``flop_util``
(measured against this machine's probes, minicb/utilisation/occupancy.py) per engine: over the
decode steps (no prompt chunk; static batching's padding rows count, they are computed),
and over every step. Medians, so a step slowed by other work on a shared
machine does not move them much; compare the two engines of the same run.

    PYTHONPATH=. python scripts/demo_utilisation.py [--rounds 300] [demo options...]

Prints one JSON line: the probed rates, and per engine the steps counted, their median
rows, forward milliseconds and both utilisations (in %).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from minicb.cli import build_parser
from minicb.core.events import StepEvent
from minicb.core.scheduler.plan import PREFILL
from minicb.server.demo_command import build_demo


def summary(events: list[StepEvent]) -> dict[str, Any]:
    """Median rows, forward ms and utilisations (%) of steps that carry them."""
    steps = [e for e in events if e.bandwidth_util is not None]
    if not steps:
        return {"steps": 0}
    return {
        "steps": len(steps),
        "rows": statistics.median(len(e.plan.scheduled) for e in steps),
        "forward_ms": round(1e3 * statistics.median(e.forward_s for e in steps), 2),
        "bandwidth_util_pct": round(100 * statistics.median(e.bandwidth_util for e in steps), 1),
        "flop_util_pct": round(100 * statistics.median(e.flop_util for e in steps), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300, help="engine-loop rounds to run")
    ours, demo = p.parse_known_args()
    args = build_parser().parse_args(["demo", "--no-wait-for-page", *demo])  # no page here
    loop, _app = build_demo(args)
    events: dict[str, list[StepEvent]] = {name: [] for name in loop.engines}
    for name, engine in loop.engines.items():
        engine.bus.subscribe(events[name].extend, kinds=["step"])
    loop.start()
    try:
        while loop.rounds < ours.rounds and loop.alive:
            time.sleep(0.2)
    finally:
        loop.stop()
    out: dict[str, Any] = {
        "command": ["demo", *demo],
        "rates": loop.engines["continuous"].describe()["runner"].get("machine_rates"),
    }
    for name, evs in events.items():
        # decode steps: no prompt chunk (static batching's padding rows are computed too)
        decode = [e for e in evs if all(r.phase != PREFILL for r in e.plan.scheduled)]
        out[name] = {"decode": summary(decode), "all": summary(evs)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
