"""The papers' results, reproduced on the simulated runner, each beside the published figure.

Every reproduction is the real engine (scheduler, block manager, metrics) over a
``SimulatedRunner`` of the paper's GPU and model, on a workload shaped like the paper's;
what it returns is labelled ``simulated`` and carries the published figures and the setup:

- ``anyscale``: the "23x" blog post (continuous batching vs static, OPT-13B, A100-40GB);
- ``vllm``: the vLLM paper's Orca Max / Pow2 / Oracle against paged KV (OPT-13B, A100-40GB);
- ``sarathi``: Sarathi-Serve's P99 time between tokens against load (Mistral-7B, A100-80GB);
- ``scale``: static against continuous at H100 scale, beside the limit case H_B.

``size`` scales the request counts (1.0 for the docs, smaller for tests). docs/reproductions.md
gives each setup, our figures beside the published ones, and what differs and why. The
fleet's reproductions (router, replicas, autoscaling, disaggregation) are minicb/fleet/'s;
``minicb bench --simulate`` runs both by name (minicb/bench/all_reproductions.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minicb.core.config import EngineConfig
from minicb.cost_model.catalogue import load_profile
from minicb.cost_model.step_time import StepTimeModel
from minicb.sim.run import harmonic, run_simulated
from minicb.workload import (
    RequestSpec,
    arrival_times,
    exponential_lengths,
    from_lengths,
    lognormal_lengths,
    with_arrivals,
)

PAPER_ENGINE = dict(enable_prefix_caching=False, max_num_seqs=256)  # none had a prefix cache


def _figures(result: dict[str, Any]) -> dict[str, Any]:
    """The figures a reproduction reports from one simulated run."""
    s = result["summary"]
    return {
        "output_tok_s": s["throughput"]["output_tokens_per_s"],
        "req_s": s["throughput"]["requests_per_s"],
        "mean_batch": s["batch"]["mean_rows_per_step"],
        "kv_utilisation": s["kv"]["utilisation"],
        "preemptions": s["preemptions"]["total"],
        "itl_p99_s": s["latency"]["itl_s"]["p99"],
        "e2e_mean_s": s["latency"]["e2e_s"]["mean"],
        "steps": s["batch"]["steps"],
    }


# ---- Anyscale: "How continuous batching enables 23x throughput" ---------------------------
ANYSCALE_SYSTEMS = {
    "static, contiguous": dict(batching="static"),
    "continuous, contiguous": dict(kv_reservation="max"),
    "continuous, paged": dict(kv_reservation="paged"),
}


def anyscale(size: float = 1.0, caps: tuple[int, ...] = (32, 128, 512, 1536)) -> dict[str, Any]:
    """1,000 requests of 512 prompt tokens, outputs exponential (mean 128) capped at each
    cap, all at once; max_tokens is the cap (what a contiguous reservation must hold)."""
    profile, n = load_profile("A100-40GB:opt-13b"), max(8, round(1000 * size))
    config = EngineConfig.from_kwargs(
        max_num_batched_tokens=2048, enable_chunked_prefill=False, **PAPER_ENGINE
    )
    rows = []
    for cap in caps:
        outs = exponential_lengths(n, 128, cap, seed=cap)
        reqs = from_lengths([512] * n, outs, max_tokens=cap)
        for system, change in ANYSCALE_SYSTEMS.items():
            result = run_simulated(profile, config.with_(**change), reqs)
            rows.append({"cap": cap, "system": system, **_figures(result)})
    base = {r["cap"]: r["output_tok_s"] for r in rows if r["system"] == "static, contiguous"}
    for r in rows:
        r["over_static"] = r["output_tok_s"] / base[r["cap"]]
    return {
        "setup": f"{profile.name}, {n} requests of 512 prompt tokens, outputs exponential of "
        f"mean 128 capped at {', '.join(map(str, caps))} (max_tokens = the cap), all at once, "
        "EOS at the drawn length; no chunked prefill, budget 2048, up to 256 running",
        "profile": profile.name,
        "rows": rows,
    }


# ---- vLLM (SOSP 2023): Orca Max / Pow2 / Oracle against paged ------------------------------
VLLM_MODES = ("max", "pow2", "oracle", "paged")
VLLM_NAMES = {"max": "Orca (Max)", "pow2": "Orca (Pow2)", "oracle": "Orca (Oracle)",
              "paged": "vLLM (paged)"}  # fmt: skip
NORMALIZED_LATENCY_TARGET_S = 0.1  # mean end-to-end seconds per output token


def sharegpt_like(n: int, seed: int, context: int = 2048) -> list[RequestSpec]:
    """Lognormal lengths with ShareGPT's means in the vLLM paper (input 161, output 338
    tokens; shape 1.0), within the context; max_tokens fills the context (Orca Max's
    reservation is up to the maximum sequence length)."""
    prompts = lognormal_lengths(n, 161, 1.0, context // 2, seed)
    outs = lognormal_lengths(n, 338, 1.0, context, seed + 1)
    outs = [min(o, context - p) for p, o in zip(prompts, outs, strict=True)]
    return from_lengths(prompts, outs, max_tokens=[context - p for p in prompts])


def _normalized_latency(
    profile: StepTimeModel, config: EngineConfig, reqs: list[RequestSpec], rate: float, seed: int
) -> float:
    """Mean normalized latency with the requests arriving as a Poisson process of ``rate``."""
    times = arrival_times(len(reqs), rate, seed=seed)
    return run_simulated(profile, config, with_arrivals(reqs, times))["normalized_latency_s"]


def sustained_rate(
    latency_at: Callable[[float], float], lo: float, hi: float, rounds: int
) -> float:
    """The highest rate in [lo, hi] whose latency stays within the target (bisection on a
    log scale; latency grows with the rate); ``lo`` itself is taken as sustained."""
    for _ in range(rounds):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if latency_at(mid) <= NORMALIZED_LATENCY_TARGET_S else (lo, mid)
    return lo


def vllm(size: float = 1.0, rounds: int = 4) -> dict[str, Any]:
    """Mean batch size and throughput with everyone waiting (the capacity), and the
    Poisson rate each mode sustains at the latency target (searched from 1/4 to 4 times
    that capacity)."""
    profile, n = load_profile("A100-40GB:opt-13b"), max(8, round(200 * size))
    reqs = sharegpt_like(n, seed=1)
    config = EngineConfig.from_kwargs(
        max_num_batched_tokens=2048, enable_chunked_prefill=False, **PAPER_ENGINE
    )
    rows = []
    for mode in VLLM_MODES:
        cfg = config.with_(kv_reservation=mode)
        figures = _figures(run_simulated(profile, cfg, reqs))
        cap = figures["req_s"]
        rate = sustained_rate(
            lambda r, cfg=cfg: _normalized_latency(profile, cfg, reqs, r, seed=2),
            cap / 4, cap * 4, rounds,
        )  # fmt: skip
        rows.append({"mode": mode, "system": VLLM_NAMES[mode], **figures, "sustained_req_s": rate})
    paged = rows[-1]
    for r in rows:
        r["paged_rate_over"] = paged["sustained_req_s"] / r["sustained_req_s"]
        r["paged_batch_over"] = paged["mean_batch"] / r["mean_batch"]
    return {
        "setup": f"{profile.name}, {n} requests, ShareGPT-like lengths (lognormal, means 161 "
        "in / 338 out, shape 1.0, within 2,048), max_tokens = 2,048 - prompt; batch size and "
        "capacity with all waiting; sustained rate: highest Poisson rate with mean normalized "
        f"latency <= {NORMALIZED_LATENCY_TARGET_S} s/token ({rounds} bisection rounds)",
        "profile": profile.name,
        "rows": rows,
    }


# ---- Sarathi-Serve (OSDI 2024): P99 TBT against load ---------------------------------------
SARATHI_SYSTEMS = {
    "no chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=16384),
    "chunks of 2048": dict(max_num_batched_tokens=2048),
    "chunks of 512": dict(max_num_batched_tokens=512),
}


def sarathi(size: float = 1.0, loads: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)) -> dict[str, Any]:
    """Poisson arrivals at fractions of the capacity (chunks of 512, all at once)."""
    profile, n = load_profile("A100-80GB:mistral-7b"), max(8, round(300 * size))
    prompts = lognormal_lengths(n, 1024, 0.6, 8192, seed=3)
    outs = lognormal_lengths(n, 256, 0.6, 1024, seed=4)
    reqs = from_lengths(prompts, outs)
    base = EngineConfig.from_kwargs(**PAPER_ENGINE)
    capacity = _figures(run_simulated(profile, base.with_(max_num_batched_tokens=512), reqs))
    rows = []
    for load in loads:
        rate = load * capacity["req_s"]
        times = arrival_times(n, rate, seed=5)
        timed = with_arrivals(reqs, times)
        for system, change in SARATHI_SYSTEMS.items():
            figures = _figures(run_simulated(profile, base.with_(**change), timed))
            rows.append({"load": load, "rate": rate, "system": system, **figures})
    return {
        "setup": f"{profile.name}, {n} requests, prompts lognormal (mean 1,024, shape 0.6, "
        "within 8,192), outputs lognormal (mean 256, shape 0.6, within 1,024), Poisson "
        f"arrivals at fractions of the capacity ({capacity['req_s']:.2f} req/s, chunks of 512)",
        "profile": profile.name,
        "capacity_req_s": capacity["req_s"],
        "rows": rows,
    }


# ---- static against continuous at H100 scale ----------------------------------------------
def scale(size: float = 1.0, profile_name: str = "H100:llama-3.1-8b") -> dict[str, Any]:
    """Static and continuous batching, 256 slots, everyone at once, exact lengths: the
    real schedulers on the simulated GPU (the prediction of their ratio is this run), and
    the limit case H_B beside it."""
    profile, n = load_profile(profile_name), max(16, round(1024 * size))
    slots, budget = min(256, n), 2048
    prompts = lognormal_lengths(n, 256, 0.8, 2048, seed=6)
    outs = exponential_lengths(n, 256, 2048, seed=7)
    reqs = from_lengths(prompts, outs)
    config = EngineConfig(max_num_seqs=slots, max_num_batched_tokens=budget,
                          enable_prefix_caching=False)  # fmt: skip
    runs = {
        mode: run_simulated(profile, config.with_(batching=mode), reqs, keep_steps=True)
        for mode in ("static", "continuous")
    }
    figures = {mode: _figures(r) for mode, r in runs.items()}
    measured = figures["continuous"]["output_tok_s"] / figures["static"]["output_tok_s"]
    return {
        "setup": f"{profile.name}, {n} requests all at once, prompts lognormal (mean 256, "
        "shape 0.8, within 2,048), outputs exponential (mean 256, within 2,048), exact "
        f"lengths (ignore EOS), {slots} slots, budget {budget}",
        "profile": profile.name,
        "figures": figures,
        "measured_ratio": measured,
        "harmonic_B": harmonic(slots),
        "occupancy": {mode: _occupancy(r["steps"]) for mode, r in runs.items()},
    }


def _occupancy(steps: list[dict[str, float]], points: int = 400) -> dict[str, list[float]]:
    """Time and busy slots (useful rows) of every k-th step, at most ``points`` of them."""
    every = max(1, len(steps) // points)
    picked = steps[::every]
    return {"t": [s["t"] for s in picked], "rows": [s["useful_rows"] for s in picked]}


# What each source reports, for the side-by-side tables (docs/reproductions.md cites them).
PUBLISHED = {
    "anyscale": "Anyscale, 'How continuous batching enables 23x throughput in LLM inference' "
    "(2023): OPT-13B on one A100-40GB; vLLM (continuous, paged) up to 23x the throughput "
    "of static batching (Hugging Face pipelines), the gap growing with the spread of "
    "output lengths (the max_tokens cap); continuous batching with a contiguous cache "
    "(TGI, Ray Serve) in between",
    "vllm": "Kwon et al., 'Efficient Memory Management for LLM Serving with PagedAttention' "
    "(SOSP 2023): on ShareGPT, vLLM sustains 1.7x-2.7x the request rate of Orca (Oracle) "
    "and 2.7x-8x that of Orca (Max) at similar latency (Fig. 12); KV memory holding "
    "token states: 20.4 % (Max), 26.8 % (Pow2), 38.2 % (Oracle), 96.3 % (vLLM) (Fig. 2)",
    "sarathi": "Agrawal et al., 'Taming Throughput-Latency Tradeoff in LLM Inference with "
    "Sarathi-Serve' (OSDI 2024): chunked prefills keep P99 time between tokens flat as "
    "load grows, where prefill-first scheduling (vLLM) stalls decodes; smaller chunks, "
    "lower P99 TBT; 2.6x the capacity of vLLM under a P99 TBT target for Mistral-7B on "
    "one A100",
    "scale": "the limit case (minicb.sim.run.harmonic): with equal step costs, exponential "
    "outputs and many requests, continuous/static tends to H_B = 1 + 1/2 + ... + 1/B",
}

REPRODUCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "anyscale": anyscale,
    "vllm": vllm,
    "sarathi": sarathi,
    "scale": scale,
}
