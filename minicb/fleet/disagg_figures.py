"""A disaggregated cluster's figures (disaggregated.py), SIMULATED: what its run cost and
how its requests fared.

Each request is counted once, as its journey over both sides: TTFT from the prefill
engine's first token, TPOT over the tokens of both, summarised by the one
``MetricsCollector`` summary (the one definition of goodput), beside the steps of every
engine. Its cost is GPU-seconds: every engine from when it was asked for (a planner's
added engine pays for its start-up) to the end, or to when a removed one had drained what
it held. And every KV transfer: bytes, blocks, seconds on the link, time queued, and how
many were held back by a full decode pool. Labelled ``simulated``. Pure Python: no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minicb.core.latency import distribution
from minicb.fleet.fleet_figures import gpu_price, merge_metrics
from minicb.telemetry.records import RequestRecord

if TYPE_CHECKING:  # the cluster calls these; only its types are named here
    from minicb.fleet.disaggregated import DisaggregatedCluster, Journey


def engine_seconds(cluster: DisaggregatedCluster, end: float) -> float:
    """GPU-seconds of every engine from when it was asked for to ``end``, or to when a
    removed one had drained what it held."""
    busy = 0.0
    for m in cluster.members:
        stop = end if m.removed is None else min(end, max(m.removed, m.clock()))
        busy += max(0.0, stop - m.added)
    return busy * cluster.profile.tp


def cluster_summary(cluster: DisaggregatedCluster) -> dict[str, Any]:
    """The cluster's figures (simulated): one metrics summary over the requests (TTFT from
    the prefill side's first token, TPOT over both sides' tokens; goodput under the
    targets) and the steps of every engine, its cost, and the transfers."""
    merged = merge_metrics([m.metrics for m in cluster.members])  # steps and time bounds
    records = merged.requests  # each request once, as its journey over both sides
    records.clear()
    records.update({(0, i): _record(j) for i, j in enumerate(cluster.journeys)})
    gpu_s = engine_seconds(cluster, merged.t_max or 0.0)
    dollars = gpu_s / 3600 * gpu_price(cluster.profile)
    out_tokens = sum(len(j.token_ids) for j in cluster.journeys)
    link, transfers = cluster.link, cluster.transfers
    return {
        "simulated": True,
        "profile": cluster.profile.name,
        "prefill_engines": len(cluster.prefill),
        "decode_engines": len(cluster.decode),
        "link": f"{link.name} ({link.gb_s:g} GB/s x {link.efficiency:g})",
        "summary": merged.summary(cluster.ttft_slo, cluster.tpot_slo),
        "gpu_hours": gpu_s / 3600,
        "usd_per_m_output_tokens": dollars / out_tokens * 1e6 if out_tokens else None,
        "scaling": cluster.scaling,
        "transfers": {
            "count": len(transfers),
            "bytes": sum(t.nbytes for t in transfers),
            "blocks": sum(t.blocks for t in transfers),
            "seconds": distribution(t.end - t.start for t in transfers),
            "queued_s": distribution(t.queued_s for t in transfers),
            "held_back": sum(t.held_back for t in transfers),
        },
    }


def _record(journey: Journey) -> RequestRecord:
    """One request's record across both sides, as a MetricsCollector keeps it."""
    return RequestRecord(journey.times, list(journey.token_times))
