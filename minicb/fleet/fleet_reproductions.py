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
  a fixed fleet sized for the peak, and an autoscaled one (goodput, cost).

``size`` scales the request counts (1.0 for the docs, smaller for tests). ``PUBLISHED``
holds what each source claims, DistServe's too (disagg_reproduction.py runs that one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minicb.chat_workload import ChatSessions, chat_conversations
from minicb.core.config import EngineConfig
from minicb.cost_model.catalogue import load_profile
from minicb.fleet.autoscale import Autoscaler
from minicb.fleet.router import POLICIES
from minicb.fleet.simulated import SimulatedFleet
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
def router(size: float = 1.0, profile: str = "A100-40GB:llama-3.1-8b", replicas: int = 8):
    """Closed-loop multi-turn chat: conversations in pairs sharing a 2,048-token document,
    4 turns each (user and answer messages of mean 64 tokens), 0.5 s pauses, all
    starting at once; the same conversations under each policy."""
    n = max(16, round(256 * size))
    convs = chat_conversations(n, turns=4, system_len=2048, num_system_prompts=n // 2,
                               user_mean=64, answer_mean=64, think_mean_s=0.5, seed=1)  # fmt: skip
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=2048)
    rows = []
    for policy in POLICIES:
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


PUBLISHED = {
    "router": "SGLang v0.4 (LMSYS blog, December 2024): its cache-aware load balancer "
    "against round-robin across data-parallel workers on a workload of shared-prefix "
    "groups: up to 1.9x throughput with a 3.8x higher cache hit rate",
    "replicas": "no single published figure: the trade-off is the textbook one (replicas "
    "scale throughput and isolate failures; tensor parallelism cuts each step's latency "
    "and pools memory into one larger batch, paying for collectives)",
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
}
