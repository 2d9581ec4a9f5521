"""What the suite runs: the systems by name, its two sizes, and its workloads at each size.

``QUICK`` and ``FULL`` are the suite's two sizes, chosen for the 2-core CPU machine with
the default 135M model (a decode step of 16 requests takes 0.1 to 0.2 s): ``--quick``
takes a minute or two, the full suite 15 to 25 minutes. A ``BenchPlan`` holds every size
and limit of one suite; ``make_workloads``, ``cache_workloads`` and ``sweep_workload``
draw the recipes of ``workloads.py`` at its size. docs/performance.md writes every
workload out exactly. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minicb.bench.workloads import (
    Workload,
    capped_exponential,
    fixed_lengths,
    multi_turn_chat,
    nanovllm_replica,
    shared_system_prompt,
    uniform_lengths,
)

SYSTEMS = (
    "minicb-continuous", "minicb-static", "minicb-static-sorted", "hf-padded", "hf-continuous",
)  # fmt: skip
MINICB = SYSTEMS[:3]
# What each minicb system changes in the continuous engine's config.
MINICB_CONFIGS = {
    "minicb-continuous": {},
    "minicb-static": {"batching": "static"},
    "minicb-static-sorted": {"batching": "static", "static_order": "length"},
}


@dataclass(frozen=True)
class BenchPlan:
    quick: bool
    max_num_seqs: int  # B: slots for minicb, batch size for padded generate, CB's limit
    repeats: int
    warmup_each_workload: bool  # else one warm-up per system, before the first workload
    sweep_requests: int  # requests per point of the latency-vs-rate sweep
    # Offered load of each sweep point, as a fraction of the request rate minicb continuous
    # sustained on the headline workload in this run: the sweep spans light load to
    # overload on any machine and model. Poisson arrivals, plus one bursty gamma point.
    loads: tuple[float, ...]
    bursty: tuple[float, float] | None  # (load, burstiness) of the gamma point
    decode_batches: tuple[int, ...]
    decode_prompt: int
    decode_warm: int
    decode_steps: int
    decode_rounds: int  # passes over the batch sizes (order rotated); medians over passes
    sched_sizes: tuple[int, ...] = (16, 64, 256)
    sched_iterations: int = 200
    max_num_batched_tokens: int = 512
    block_size: int = 16
    ttft_slo: float = 5.0  # seconds
    tpot_slo: float = 0.25  # seconds
    seed: int = 0
    systems: tuple[str, ...] = field(default=SYSTEMS)


FULL = BenchPlan(
    quick=False, max_num_seqs=16, repeats=3, warmup_each_workload=True, sweep_requests=24,
    loads=(0.25, 0.5, 0.75, 1.0), bursty=(0.5, 0.5), decode_batches=(1, 4, 8, 16, 32, 64),
    decode_prompt=32, decode_warm=2, decode_steps=8, decode_rounds=3,
)  # fmt: skip
QUICK = BenchPlan(
    quick=True, max_num_seqs=8, repeats=1, warmup_each_workload=False, sweep_requests=8,
    loads=(0.5, 1.0), bursty=None, decode_batches=(1, 8, 32), decode_prompt=16,
    decode_warm=1, decode_steps=3, decode_rounds=1, sched_iterations=50,
)  # fmt: skip


def make_workloads(plan: BenchPlan, vocab: int) -> list[Workload]:
    """The offline workloads, all requests arriving at once; the first is the headline."""
    s = plan.seed
    if plan.quick:
        return [
            # 2 x B requests: continuous batching needs a queue to refill its slots from.
            capped_exponential(16, prompt_len=16, mean_output=8, cap=32, vocab=vocab, seed=s),
            uniform_lengths(8, (4, 32), (1, 16), vocab=vocab, seed=s),
            nanovllm_replica(8, (4, 32), vocab=vocab, seed=s),
            fixed_lengths(8, prompt_len=16, output_len=16, vocab=vocab, seed=s),
        ]
    return [
        # The sources scaled: 4 x B requests (so the tail where slots empty matters little),
        # prompts / 16; Orca's prompts / 8, outputs / 4; nano-vllm's requests / 8, lengths / 16.
        capped_exponential(64, prompt_len=32, mean_output=16, cap=64, vocab=vocab, seed=s),
        uniform_lengths(32, (4, 64), (1, 32), vocab=vocab, seed=s),
        nanovllm_replica(32, (6, 64), vocab=vocab, seed=s),
        fixed_lengths(32, prompt_len=32, output_len=32, vocab=vocab, seed=s),
    ]


def cache_workloads(plan: BenchPlan, vocab: int) -> list[Workload]:
    """The two prefix-caching workloads, run with caching off and on. The system prompt is
    longer than one step's token budget admits at once for a few requests: requests
    admitted in the same step as the first cannot share its blocks (they are cached only
    once written), the later ones can."""
    s = plan.seed
    if plan.quick:
        return [
            shared_system_prompt(8, 128, (4, 16), 8, vocab=vocab, seed=s),
            multi_turn_chat(2, 3, 32, 8, vocab=vocab, think_s=0.5, seed=s),
        ]
    return [
        shared_system_prompt(16, 192, (8, 32), 16, vocab=vocab, seed=s),
        multi_turn_chat(4, 4, 48, 16, vocab=vocab, think_s=1.0, seed=s),
    ]


def sweep_workload(plan: BenchPlan, vocab: int) -> Workload:
    """The headline recipe with fewer requests, for the latency-vs-rate sweep."""
    params = {**make_workloads(plan, vocab)[0].params, "n": plan.sweep_requests}
    return capped_exponential(**params, vocab=vocab, seed=plan.seed + 1)
