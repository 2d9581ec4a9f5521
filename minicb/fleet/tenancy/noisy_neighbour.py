"""A noisy neighbour, SIMULATED: one tenant sends ten times another's load.

Three runs of the same requests on the same simulated fleet (SimulatedFleet: real
engines on simulated GPUs, the real router), in one process:

- ``solo``: the light tenant alone, no fair queue: the TTFT it is owed;
- ``shared, no fair queue``: both tenants, each request routed as it arrives: the engines
  serve first come, first served, so the light tenant waits behind the heavy one's backlog;
- ``shared, fair queue``: both, through a FairQueue (one band, deficit round robin over
  uncached prompt tokens) with at most ``max_in_flight`` requests per replica: when a
  replica has room, the light tenant's next request goes before the heavy one's backlog.

The guarantee it checks (``BOUND``): with the fair queue, the light tenant's TTFT p99 is at
most ``BOUND_RATIO`` x its solo p99 + ``BOUND_SLACK_S``: the slack is the wait for a slot to
free (a request ends somewhere in the fleet) plus its prefill next to the others'. Without
the queue there is no such bound: the light tenant's TTFT grows with the heavy one's queue.

    python -m minicb.fleet.tenancy.noisy_neighbour [--size 0.5]
"""

from __future__ import annotations

import argparse
from typing import Any

from minicb.core.config import EngineConfig
from minicb.core.latency import percentile, ttft
from minicb.fleet.simulated import SimulatedFleet
from minicb.fleet.tenancy.fair_queue import FairQueue
from minicb.fleet.tenancy.tenant import Tenant
from minicb.workload import (
    Arrivals,
    RequestSpec,
    arrival_times,
    from_lengths,
    lognormal_lengths,
    with_arrivals,
)

PROFILE = "L4:llama-3.1-8b"
LIGHT_RATE = 1.5  # requests a second; the heavy tenant sends ten times as many
HEAVY_FACTOR = 10
BOUND_RATIO, BOUND_SLACK_S = 1.5, 0.5  # the stated bound: p99 <= 1.5 x solo p99 + 0.5 s
MAX_IN_FLIGHT = 64  # requests per replica (its slots): the rest wait in the fair queue


def tenant_requests(name: str, rate: float, duration_s: float, seed: int) -> list[RequestSpec]:
    """Poisson arrivals at ``rate`` for ``duration_s``; lognormal prompts (mean 512) and
    outputs (mean 96), all labelled with the tenant (``group``)."""
    times = [t for t in arrival_times(round(rate * duration_s * 1.5) + 2, rate, seed=seed)
             if t < duration_s]  # fmt: skip
    prompts = lognormal_lengths(len(times), 512, 0.8, 2048, seed + 1)
    outputs = lognormal_lengths(len(times), 96, 0.8, 512, seed + 2)
    # distinct first tokens per tenant: no request shares a cached prefix with another
    reqs = from_lengths(prompts, outputs, vocab=32000)
    offset = 1000 * seed
    reqs = [RequestSpec([offset + i + 3, *r.prompt[1:]], r.max_tokens, group=name)  # type: ignore[misc]
            for i, r in enumerate(reqs)]  # fmt: skip
    return with_arrivals(reqs, times)


def _ttfts(fleet: SimulatedFleet) -> dict[str, list[float]]:
    """Each tenant's TTFTs (seconds, sorted), from where each request was placed."""
    out: dict[str, list[float]] = {}
    by_index = {r.index: r for r in fleet.replicas}
    for request, index, rid in fleet.placed:
        record = by_index[index].metrics.requests[(0, rid)]
        out.setdefault(request.group, []).append(ttft(record.arrival, record.token_times[0]))
    return {name: sorted(values) for name, values in out.items()}


def run(size: float = 1.0, replicas: int = 2, profile: str = PROFILE) -> dict[str, Any]:
    """The three runs; each row: per-tenant TTFT p50/p99 and requests refused."""
    duration = 120.0 * size
    light = tenant_requests("light", LIGHT_RATE, duration, seed=1)
    heavy = tenant_requests("heavy", LIGHT_RATE * HEAVY_FACTOR, duration, seed=2)
    both = sorted(light + heavy, key=lambda r: r.arrival)
    config = EngineConfig(max_num_seqs=MAX_IN_FLIGHT, max_num_batched_tokens=2048)
    queue = FairQueue([Tenant("light"), Tenant("heavy")])
    runs = {
        "solo": (light, None),
        "shared, no fair queue": (both, None),
        "shared, fair queue": (both, queue),
    }
    rows = []
    for name, (requests, q) in runs.items():
        fleet = SimulatedFleet(profile, config, "least-loaded", replicas, queue=q,
                               max_in_flight=MAX_IN_FLIGHT)  # fmt: skip
        fleet.run(Arrivals(requests))
        row: dict[str, Any] = {"run": name}
        for tenant, values in _ttfts(fleet).items():
            row[f"{tenant}_ttft_p50_s"] = percentile(values, 50)
            row[f"{tenant}_ttft_p99_s"] = percentile(values, 99)
            row[f"{tenant}_served"] = len(values)
        for tenant in ("light", "heavy"):
            row[f"{tenant}_refused"] = sum(r.group == tenant for r, _ in fleet.refused)
        rows.append(row)
    solo = rows[0]["light_ttft_p99_s"]
    bound = BOUND_RATIO * solo + BOUND_SLACK_S
    return {
        "simulated": True,
        "setup": f"{replicas} replicas of {profile} ({MAX_IN_FLIGHT} slots, budget 2,048 each; "
        f"least-loaded), {duration:.0f} s of Poisson arrivals: light {LIGHT_RATE} req/s, heavy "
        f"{LIGHT_RATE * HEAVY_FACTOR:g} req/s; prompts lognormal mean 512, outputs mean 96; "
        f"fair queue: one band, quantum 512 uncached tokens, {MAX_IN_FLIGHT} in flight per "
        "replica, 64 queued per tenant",
        "rows": rows,
        "bound_s": bound,
        "bound": f"light TTFT p99 <= {BOUND_RATIO} x solo p99 + {BOUND_SLACK_S} s = {bound:.3f} s",
        "holds": rows[2]["light_ttft_p99_s"] <= bound,
    }


def report(result: dict[str, Any]) -> str:
    lines = [f"noisy neighbour (SIMULATED): {result['setup']}", ""]
    head = f"{'run':<24}{'light p50':>10}{'light p99':>10}{'heavy p50':>10}{'heavy p99':>10}"
    lines += [head + f"{'heavy refused':>15}"]
    for r in result["rows"]:
        cells = [r.get(f"{t}_ttft_{q}_s") for t in ("light", "heavy") for q in ("p50", "p99")]
        text = "".join(f"{'-' if c is None else f'{c:.3f}':>10}" for c in cells)
        lines.append(f"{r['run']:<24}{text}{r['heavy_refused']:>15}")
    lines += ["", f"bound: {result['bound']}: {'holds' if result['holds'] else 'BROKEN'}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=float, default=1.0, help="scales the run's duration")
    args = p.parse_args(argv)
    print(report(run(args.size)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
