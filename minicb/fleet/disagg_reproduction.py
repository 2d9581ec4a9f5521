"""DistServe's result, reproduced on simulated GPUs: colocated against disaggregated prefill
and decode at equal GPU count, under a TTFT and a TPOT target (SIMULATED).

DistServe (OSDI 2024) reports up to 7.4x the goodput of colocated serving; vLLM's docs
say disaggregated prefill does not raise throughput and exists to tune TTFT and ITL
apart. ``disaggregation`` runs both claims on the fleet's simulated engines
(minicb/fleet/: a least-loaded router over colocated engines, and the disaggregated
cluster with its KV transfer over a named link) on one workload of long prompts; the
published figures are the fleet's (fleet_reproductions.PUBLISHED), and disagg_report.py prints
the tables docs/reproductions.md quotes. It lives in the fleet because it drives the
fleet's simulated engines; the simulator below (minicb/sim/) gives it the runner.
"""

from __future__ import annotations

from typing import Any

from minicb.core.config import EngineConfig
from minicb.cost_model.catalogue import load_profile
from minicb.fleet.disaggregated import DisaggregatedCluster
from minicb.fleet.simulated import SimulatedFleet
from minicb.sim.paper_reproductions import PAPER_ENGINE
from minicb.workload import (
    Arrivals,
    arrival_times,
    from_lengths,
    lognormal_lengths,
    with_arrivals,
)

DISAGG_PROFILE = "H100:llama-3.1-8b"
DISAGG_SLO = {"ttft_slo": 1.0, "tpot_slo": 0.015}  # seconds; TPOT ~2x a lone decode step
DISAGG_ATTAINMENT = 0.9  # DistServe's goodput: the highest rate with 90 % within the SLO
DISAGG_SYSTEMS = {
    "colocated, prefill first": dict(enable_chunked_prefill=False, max_num_batched_tokens=16384),
    "colocated, chunks of 512": dict(max_num_batched_tokens=512),
    "disaggregated": dict(max_num_batched_tokens=8192),
}


def disaggregation(
    size: float = 1.0,
    rates: tuple[float, ...] = (8.0, 16.0, 24.0, 32.0),
    links: tuple[str, ...] = ("NVLink 4", "InfiniBand NDR", "Ethernet 100G"),
    split_rate: float | None = 48.0,
    decode_pools: tuple[int, ...] = (4000, 2000),
) -> dict[str, Any]:
    """Colocated against disaggregated at equal GPU count under a TTFT and a TPOT target,
    long prompts, Poisson arrivals: on two GPUs at each rate, two colocated engines behind
    the least-loaded router (prefill first, as the vLLM that DistServe measured; chunked,
    as vLLM now runs) and one prefill + one decode engine over NVLink; the pair at the
    second rate over slower links (what the transfer costs), and with a decode pool of
    each of ``decode_pools`` blocks (backpressure); on four GPUs at ``split_rate`` (twice
    the requests), each split of prefill and decode engines."""
    profile, n = load_profile(DISAGG_PROFILE), max(24, round(150 * size))
    engine = EngineConfig.from_kwargs(**PAPER_ENGINE)

    def run(system: str, rate: float, gpus: int = 2, prefill: int = 1,
            link_name: str = "NVLink 4",
            decode_pool: int | None = None) -> dict[str, Any]:  # fmt: skip
        count = n * gpus // 2  # the same requests per GPU
        reqs = from_lengths(lognormal_lengths(count, 2048, 0.6, 8192, seed=11),
                            lognormal_lengths(count, 128, 0.6, 512, seed=12))  # fmt: skip
        timed = Arrivals(with_arrivals(reqs, arrival_times(count, rate, seed=13)))
        config = engine.with_(**DISAGG_SYSTEMS[system])
        if system == "disaggregated":
            split = f"{prefill}P+{gpus - prefill}D"
            decode = config.with_(num_kv_blocks=decode_pool)  # None: what the GPU holds
            result = DisaggregatedCluster(profile, prefill, gpus - prefill, config,
                                          decode_config=decode, link_name=link_name,
                                          **DISAGG_SLO).run(timed)  # fmt: skip
        else:
            split = f"x{gpus}"
            result = SimulatedFleet(profile, config, "least-loaded", gpus, **DISAGG_SLO).run(timed)
        s = result["summary"]
        row = {"rate": rate, "system": system, "split": split, "link": link_name,
               "output_tok_s": s["throughput"]["output_tokens_per_s"],
               "ttft_p99_s": s["latency"]["ttft_s"]["p99"],
               "tpot_p99_s": s["latency"]["tpot_s"]["p99"],
               "attainment": s["goodput"]["fraction"],
               "goodput_req_s": s["goodput"]["requests_per_s"]}  # fmt: skip
        if "transfers" in result:
            moved = result["transfers"]
            row["transfer_ms_mean"] = moved["seconds"]["mean"] * 1e3
            row["kv_mb_mean"] = moved["bytes"] / moved["count"] / 1e6
            row["held_back"] = moved["held_back"]
            row["queued_p99_s"] = moved["queued_s"]["p99"]
            row["decode_blocks"] = decode_pool or profile.num_kv_blocks(engine.block_size)
        return row

    rows = [run(system, rate) for rate in rates for system in DISAGG_SYSTEMS]
    capacity = {
        system: max((r["rate"] for r in rows if r["system"] == system
                     and r["attainment"] >= DISAGG_ATTAINMENT), default=0.0)
        for system in DISAGG_SYSTEMS
    }  # fmt: skip
    link_rate = rates[min(1, len(rates) - 1)]
    swept = {
        r["link"]: r for r in rows if r["system"] == "disaggregated" and r["rate"] == link_rate
    }
    link_rows = [
        swept.get(name) or run("disaggregated", link_rate, link_name=name) for name in links
    ]
    pool_rows = [swept["NVLink 4"]] if "NVLink 4" in swept else []
    pool_rows += [run("disaggregated", link_rate, decode_pool=b) for b in decode_pools]
    split_rows = []
    if split_rate is not None:
        split_rows = [run(system, split_rate, 4) for system in list(DISAGG_SYSTEMS)[:2]]
        split_rows += [run("disaggregated", split_rate, 4, p) for p in (1, 2, 3)]
    return {
        "setup": f"{profile.name}, {n} requests per two GPUs at each rate (Poisson), prompts "
        "lognormal (mean 2,048, shape 0.6, within 8,192), outputs lognormal (mean 128, "
        "shape 0.6, within 512), exact lengths; SLO: TTFT <= "
        f"{DISAGG_SLO['ttft_slo']:g} s and TPOT <= {DISAGG_SLO['tpot_slo'] * 1e3:g} ms per "
        f"request; capacity = the highest swept rate with {DISAGG_ATTAINMENT:.0%} of "
        "requests within both",
        "profile": profile.name,
        "rows": rows,
        "slo_capacity_req_s": capacity,
        "link_rows": link_rows,
        "pool_rows": pool_rows,
        "split_rows": split_rows,
    }
