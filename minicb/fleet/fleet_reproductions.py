"""The fleet's reproductions, SIMULATED: replicas behind a router at data-centre scale.

Each is a ``SimulatedFleet`` (minicb/fleet/simulated.py: real engines on simulated GPUs,
the real router) on a workload of the one workload module; ``minicb bench --simulate ...
--reproduce router replicas autoscale`` runs them beside the papers' reproductions
(minicb/bench/all_reproductions.py), and fleet_report.py writes their sections:

- ``router``: round-robin, least-loaded and prefix-aware routing on a multi-turn chat
  whose conversations share long prefixes (SGLang's cache-aware router against
  round-robin: throughput and prefix-cache hit rate);
- ``replicas``: N replicas of one GPU against one engine over N GPUs (tensor parallel, one
  big batch) at the same GPU count and the same load;
- ``autoscale``: a load that doubles halfway, on a fixed fleet sized for the first half,
  a fixed fleet sized for the peak, and an autoscaled one (goodput, cost);
- ``planner``: a load that ramps up and down, on the queue-length autoscaler's colocated
  fleet, and on a disaggregated one whose prefill and decode pools are sized apart by the
  queue-length autoscaler run on each (pool_autoscale.py) or by the SLA planner
  (sla_planner.py): when each one is over its targets, and the GPUs it used.

``size`` scales the request counts (1.0 for the docs, smaller for tests). ``PUBLISHED``
holds what each source claims, DistServe's too (disagg_reproduction.py runs that one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from minicb.chat_workload import ChatSessions, chat_conversations
from minicb.core.config import EngineConfig
from minicb.cost_model.catalogue import load_profile
from minicb.fleet.autoscale import Autoscaler
from minicb.fleet.disaggregated import DisaggregatedCluster
from minicb.fleet.pool_autoscale import PoolAutoscalers
from minicb.fleet.ramp import over_target, ramp_times
from minicb.fleet.router import POLICIES
from minicb.fleet.simulated import SimulatedFleet
from minicb.fleet.sla_planner import PerformanceModel, SLAPlanner
from minicb.workload import (
    Arrivals,
    RequestSpec,
    arrival_times,
    from_lengths,
    lognormal_lengths,
    with_arrivals,
)

TTFT_SLO_S, TPOT_SLO_S = 1.0, 0.1  # the goodput targets of every fleet run here


def _figures(result: dict[str, Any]) -> dict[str, Any]:
    s = result["summary"]
    good = s["goodput"] or {}
    return {
        "output_tok_s": s["throughput"]["output_tokens_per_s"],
        "hit_rate": s["prefix_cache"]["hit_rate"],
        "prefill_tokens": s["prefix_cache"]["prefill_tokens"],
        "ttft_p50_s": s["latency"]["ttft_s"]["p50"],
        "ttft_p99_s": s["latency"]["ttft_s"]["p99"],
        "tpot_p50_s": s["latency"]["tpot_s"]["p50"],
        "tpot_p99_s": s["latency"]["tpot_s"]["p99"],
        "goodput_req_s": good.get("requests_per_s"),
        "slo_attainment": good.get("fraction"),
        "duration_s": s["duration_s"],
        "finished": s["requests"]["finished"],
        "gpu_hours": result["gpu_hours"],
        "usd_per_m_output_tokens": result["usd_per_m_output_tokens"],
        "replicas_max": result["replicas_max"],
    }


def _fleet(profile: str, config: EngineConfig, policy: str, n: int, **kw: Any) -> SimulatedFleet:
    return SimulatedFleet(profile, config, policy, n, ttft_slo=TTFT_SLO_S, tpot_slo=TPOT_SLO_S,
                          **kw)  # fmt: skip


# ---- SGLang's cache-aware router against round-robin ---------------------------------------
def router(
    size: float = 1.0,
    profile: str = "A100-40GB:llama-3.1-8b",
    replicas: int = 8,
    policies: tuple[str, ...] = POLICIES,
):
    """Closed-loop multi-turn chat: conversations in pairs sharing a 2,048-token document,
    4 turns each (user and answer messages of mean 64 tokens), 0.5 s pauses, all
    starting at once; the same conversations under each policy."""
    n = max(16, round(256 * size))
    convs = chat_conversations(n, turns=4, system_len=2048, num_system_prompts=n // 2,
                               user_mean=64, answer_mean=64, think_mean_s=0.5, seed=1)  # fmt: skip
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=2048)
    rows = []
    for policy in policies:
        result = _fleet(profile, config, policy, replicas).run(ChatSessions(convs))
        rows.append({"policy": policy, **_figures(result)})
    base = rows[0]
    for r in rows:
        r["tok_s_over_rr"] = r["output_tok_s"] / base["output_tok_s"]
        r["hit_over_rr"] = r["hit_rate"] / base["hit_rate"] if base["hit_rate"] else None
    return {
        "setup": f"{replicas} replicas of {profile}, {n} conversations of 4 turns (closed "
        "loop: each turn 0.5 s on average after the previous answer), every two sharing a "
        "2,048-token document as their system prompt, user and answer messages exponential "
        "of mean 64 tokens, all starting at once; prefix caching on in every replica, "
        "256 slots and a budget of 2,048 each",
        "profile": load_profile(profile).name,
        "rows": rows,
    }


# ---- replicas against one big batch at the same GPU count ---------------------------------
def _sharegpt_like(n: int, seed: int) -> list[RequestSpec]:
    """Lognormal lengths with ShareGPT's means in the vLLM paper (161 in, 338 out)."""
    prompts = lognormal_lengths(n, 161, 1.0, 1024, seed)
    return from_lengths(prompts, lognormal_lengths(n, 338, 1.0, 1024, seed + 1))


def replicas(size: float = 1.0, profile: str = "H100:llama-3.1-8b", gpus: int = 4):
    """The same requests, all at once (ShareGPT-like lengths), on ``gpus`` replicas of one
    GPU (least-loaded) and on one engine over ``gpus`` GPUs (tensor parallel)."""
    n = max(32, round(600 * size))
    reqs = _sharegpt_like(n, seed=11)
    one = EngineConfig(max_num_seqs=256, max_num_batched_tokens=2048)
    big = one.with_(tensor_parallel_size=gpus, max_num_seqs=256 * gpus,
                    max_num_batched_tokens=2048 * gpus)  # fmt: skip
    systems = {
        f"{gpus} replicas x 1 GPU": _fleet(profile, one, "least-loaded", gpus),
        f"1 engine x {gpus} GPUs (TP)": _fleet(profile, big, "least-loaded", 1),
    }
    rows = [{"system": name, **_figures(fleet.run(Arrivals(reqs)))}
            for name, fleet in systems.items()]  # fmt: skip
    return {
        "setup": f"{profile}, {gpus} GPUs either way, {n} requests, ShareGPT-like lengths "
        "(lognormal, means 161 in / 338 out, shape 1.0, within 1,024), all at once; "
        "replicas: 256 slots and a budget of 2,048 each, routed "
        f"least-loaded; the one engine: {256 * gpus} slots, a budget of {2048 * gpus}",
        "profile": load_profile(profile).name,
        "rows": rows,
    }


# ---- autoscaling against a load that doubles ----------------------------------------------
def autoscale(size: float = 1.0, profile: str = "L4:llama-3.1-8b", rate: float = 7.0):
    """Poisson at ``rate`` for a minute, then twice that for two: fixed fleets of 1 and 2
    replicas (sized for each part), and one autoscaled from 1 (up to 4)."""
    low, high = 60.0 * max(size, 0.1), 120.0 * max(size, 0.1)
    first = arrival_times(max(2, round(1.5 * rate * low)), rate, seed=21)
    second = arrival_times(max(2, round(3 * rate * high)), 2 * rate, seed=22)
    times = [t for t in first if t < low] + [low + t for t in second if t < high]
    prompts = lognormal_lengths(len(times), 256, 1.0, 1024, 23)
    outs = lognormal_lengths(len(times), 64, 1.0, 1024, 24)
    reqs = with_arrivals(from_lengths(prompts, outs), times)
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=2048)
    scaler = Autoscaler(min_replicas=1, max_replicas=4, max_waiting_per_replica=4.0,
                        min_attainment=0.9, idle_s=30.0, interval_s=5.0, window_s=20.0)  # fmt: skip
    systems = {
        "fixed, 1 replica": _fleet(profile, config, "least-loaded", 1),
        "fixed, 2 replicas": _fleet(profile, config, "least-loaded", 2),
        "autoscaled from 1": _fleet(profile, config, "least-loaded", 1, autoscaler=scaler),
    }
    rows = [{"system": name, **_figures(fleet.run(Arrivals(reqs)))}
            for name, fleet in systems.items()]  # fmt: skip
    scaled = systems["autoscaled from 1"]
    return {
        "setup": f"{profile}, {len(reqs)} requests, lognormal lengths (means 256 in / 64 "
        "out, shape 1.0, within 1,024), "
        f"Poisson at {rate:g} req/s for {low:.0f} s, then {2 * rate:g} req/s for "
        f"{high:.0f} s; least-loaded routing; autoscaler: add when over 4 waiting per "
        "ready replica or SLO attainment under 90 % over 20 s (looked at every 5 s, one "
        "start at a time, then a 20 s window to settle), remove after 30 s idle, 1 to 4 "
        "replicas; start-up "
        f"{systems['autoscaled from 1'].startup_s:.0f} s (catalogue: fixed + weights read); "
        f"targets TTFT {TTFT_SLO_S:g} s, TPOT {TPOT_SLO_S * 1000:.0f} ms",
        "profile": load_profile(profile).name,
        "rows": rows,
        "scaling": scaled.scaling,
        # the autoscaled fleet's size from the start and after each decision
        "replicas_over_time": {
            "t": [0.0] + [x["time"] for x in scaled.scaling],
            "replicas": scaled.replica_counts(),
        },
    }


# ---- two autoscalers on a load that ramps up and down ---------------------------------------
def planner(size: float = 1.0, profile: str = "L4:llama-3.1-8b", low: float = 2.0,
            peak: float = 14.0, bin_s: float = 10.0):  # fmt: skip
    """A load that ramps from ``low`` to ``peak`` req/s and back over four minutes, the
    same requests on: the queue-length autoscaler on colocated replicas (from 2); a
    disaggregated fleet (from one prefill and one decode engine) under the queue-length
    autoscaler on each pool; and the same fleet under the SLA planner, looking every 10 s,
    with a trend predictor and with a constant one."""
    duration = 240.0 * max(size, 0.1)
    times = ramp_times(low, peak, duration, seed=31)
    prompts = lognormal_lengths(len(times), 512, 1.0, 2048, 32)
    outs = lognormal_lengths(len(times), 128, 1.0, 1024, 33)
    reqs = with_arrivals(from_lengths(prompts, outs), times)
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=2048)
    model = PerformanceModel.of(load_profile(profile), config)
    scaler = Autoscaler(min_replicas=2, max_replicas=8, max_waiting_per_replica=4.0,
                        min_attainment=0.9, idle_s=30.0, interval_s=5.0, window_s=20.0)  # fmt: skip
    colocated = _fleet(profile, config, "least-loaded", 2, autoscaler=scaler)
    per_pool = PoolAutoscalers(replace(scaler, min_replicas=1), TTFT_SLO_S, TPOT_SLO_S)
    clusters = {"queue-length autoscaler per pool, disaggregated": DisaggregatedCluster(
        profile, 1, 1, config, ttft_slo=TTFT_SLO_S, tpot_slo=TPOT_SLO_S, planner=per_pool,
    )}  # fmt: skip
    clusters |= {
        f"SLA planner ({p} predictor), disaggregated": DisaggregatedCluster(
            profile, 1, 1, config, ttft_slo=TTFT_SLO_S, tpot_slo=TPOT_SLO_S,
            planner=SLAPlanner(model, TTFT_SLO_S, TPOT_SLO_S, interval_s=10.0, predictor=p,
                               lookahead_s=colocated.startup_s),
        )
        for p in ("trend", "constant")
    }  # fmt: skip
    rows, over_time = [], {}
    result = colocated.run(Arrivals(reqs))
    journeys = [(rec.arrival, rec.token_times) for r in colocated.replicas
                for rec in r.metrics.requests.values()]  # fmt: skip
    name = "queue-length autoscaler, colocated"
    over_time[name] = {"t": [0.0] + [x["time"] for x in colocated.scaling],
                       "gpus": colocated.replica_counts()}  # fmt: skip
    rows.append({"system": name, "scaling": colocated.scaling, **_figures(result),
                 **over_target(journeys, bin_s, TTFT_SLO_S, TPOT_SLO_S)})  # fmt: skip
    for name, cluster in clusters.items():
        result = cluster.run(Arrivals(reqs))
        journeys = [(j.times.arrival_time, j.token_times) for j in cluster.journeys]
        gpus = [2] + [x["prefill"] + x["decode"] for x in cluster.scaling]
        over_time[name] = {"t": [0.0] + [x["time"] for x in cluster.scaling], "gpus": gpus}
        rows.append({"system": name, "scaling": cluster.scaling,
                     **_figures({**result, "replicas_max": max(gpus)}),
                     **over_target(journeys, bin_s, TTFT_SLO_S, TPOT_SLO_S)})  # fmt: skip
    return {
        "setup": f"{profile}, {len(reqs)} requests, lognormal lengths (means 512 in / 128 "
        f"out, shape 1.0, within 2,048 and 1,024), Poisson from {low:g} req/s rising to "
        f"{peak:g} at {duration / 2:.0f} s and back to {low:g} at {duration:.0f} s; targets "
        f"TTFT {TTFT_SLO_S:g} s, TPOT {TPOT_SLO_S * 1000:.0f} ms. Queue-length autoscaler: "
        "colocated replicas routed least-loaded, 2 to 8, add when over 4 waiting per ready "
        "replica or attainment under 90 % over 20 s (looked at every 5 s, one start at a "
        "time, a 20 s window to settle), remove after 30 s idle; per pool: the same on each "
        "pool of the disaggregated fleet, 1 to 8 engines, attainment of the pool's own "
        "target (TTFT for prefill, ITL for decode). SLA planner: a prefill and a decode pool "
        "of 1 to 8 engines each over NVLink 4, looked at every 10 s, its model the step-time "
        "model's, corrections smoothed by half. Start-up "
        f"{colocated.startup_s:.0f} s either way; over target: a {bin_s:g} s bin of "
        "arrivals whose p90 is over the target",
        "profile": load_profile(profile).name,
        "rows": rows,
        "bin_s": bin_s,
        "gpus_over_time": over_time,
    }


PUBLISHED = {
    "router": "SGLang v0.4 (LMSYS blog, December 2024): its cache-aware load balancer "
    "against round-robin across data-parallel workers on a workload of shared-prefix "
    "groups: up to 1.9x throughput with a 3.8x higher cache hit rate",
    "replicas": "no single published figure: the trade-off is the textbook one (replicas "
    "scale throughput and isolate failures; tensor parallelism cuts each step's latency "
    "and pools memory into one larger batch, paying for collectives)",
    "planner": "no published figure: NVIDIA Dynamo's SLA planner (docs/architecture/"
    "sla_planner.md, v1.7) predicts the next interval's load, corrects its profiled TTFT and "
    "ITL by observed / expected, and sets prefill replicas = ceil(predicted load / "
    "profiled throughput) and decode replicas from ITL against batch",
    "autoscale": "no published figure: the common shape of production autoscalers "
    "(Kubernetes HPA on a queue metric, KServe/Knative on concurrency); the trade-off is "
    "SLO attainment against GPU-hours",
    "disaggregation": "Zhong et al., 'DistServe: Disaggregating Prefill and Decoding for "
    "Goodput-optimized Large Language Model Serving' (OSDI 2024): against vLLM and "
    "DeepSpeed-MII, up to 7.4x more requests or 12.6x tighter SLOs while over 90 % of "
    "requests meet their latency targets (goodput: the highest rate at that attainment; "
    "OPT-13B/66B/175B on A100s; chatbot, code completion, summarisation). vLLM's "
    "documentation (Disaggregated Prefilling): 'Disaggregated prefill DOES NOT improve "
    "throughput'; it exists to tune TTFT and ITL separately and to control tail ITL",
}

REPRODUCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "router": router,
    "replicas": replicas,
    "autoscale": autoscale,
    "planner": planner,
}
