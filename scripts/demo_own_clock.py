"""What the demo's tok/s and TTFT counters read for a burst drained by both engines: each
side's own clock (the seconds of its own steps, the step events' ``busy_s``) against the
wall clock the two engines share in the demo's one engine thread.

Builds the demo exactly as ``minicb demo`` does (its engines, its workload feeder, the same
defaults; any demo option may be passed), runs its engine loop with no browser until every
request of the burst has finished on both engines, and prints per engine the iterations,
output tokens/s over the drain and TTFT p50, on the own clock (the page's definition,
minicb/scenarios/side_figures.py's SideRecord) and on the wall clock. Compare the two engines of
the same run: the machine is shared.

    PYTHONPATH=. python scripts/demo_own_clock.py [--burst 24] [demo options...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from minicb.cli import build_parser
from minicb.scenarios.side_figures import SideRecord, side_metric
from minicb.server.demo_command import build_demo


def ttft_p50(record: SideRecord, clock: Callable[[float], float]) -> float:
    """Median seconds from arrival to first token, both read on ``clock``."""
    arrived = {e.request_id: clock(e.time) for e in record.requests["arrived"]}
    first = {e.request_id: clock(e.time) for e in record.requests["first_token"]}
    return statistics.median(first[rid] - arrived[rid] for rid in first)


def figures(record: SideRecord) -> dict[str, float]:
    tokens = sum(e.num_output_tokens for e in record.requests["finished"])
    start = min(e.time for e in record.requests["arrived"])
    wall = max(e.time for e in record.requests["finished"]) - start
    return {
        "iterations": len(record.steps),
        "own_tok_s": round(side_metric(record, "throughput"), 1),
        "wall_tok_s": round(tokens / wall, 1),
        "own_ttft_p50_s": round(ttft_p50(record, record.own), 2),
        "wall_ttft_p50_s": round(ttft_p50(record, lambda t: t), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _, rest = parser.parse_known_args()
    demo = ["demo", "--no-wait-for-page", "--workload", "off", "--burst", "24"]  # no page here
    args = build_parser().parse_args([*demo, *rest])
    loop, _ = build_demo(args)
    records = {name: SideRecord({}) for name in loop.engines}
    for name, engine in loop.engines.items():
        engine.bus.subscribe(records[name])
    loop.delay_s = 0.0
    loop.start()
    try:
        while any(len(r.requests["finished"]) < args.burst for r in records.values()):
            time.sleep(0.5)
    finally:
        loop.stop()
    print(json.dumps({name: figures(r) for name, r in records.items()}))


if __name__ == "__main__":
    main()
