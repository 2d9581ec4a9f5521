"""What the benchmark runs: its recipes, seeded request sets with exact lengths.

Every request is given as token ids with a ``max_tokens`` and is run with ``ignore_eos``
(or the equivalent in transformers), so each one generates exactly ``max_tokens`` tokens
and every system does the same work. Prompts are random token ids: the model's output is
irrelevant here, only the lengths matter.

- ``capped_exponential``: fixed prompt length, output lengths drawn from an exponential
  and capped (Anyscale's method in "How continuous batching enables 23x throughput": 1000
  requests, 512 prompt tokens, exponential output lengths capped at 32 ... 1536);
- ``uniform_lengths``: prompt and output lengths uniform in ranges (Orca's synthetic
  workload: prompts in [32, 512], outputs in [1, 128]);
- ``nanovllm_replica``: nano-vllm's bench.py (256 requests, random ids in [0, 10000],
  prompt and output lengths uniform in [100, 1024], temperature 0.6, ignore_eos);
- ``fixed_lengths``: every prompt and output the same length, the control where
  continuous batching has nothing to win.

Two more, for prefix caching (most of each prompt seen before):

- ``shared_system_prompt``: one system prompt in front of every request, then a question
  of its own (the common case of a deployed assistant);
- ``multi_turn_chat``: conversations whose every turn's prompt is the previous turn's
  prompt, an answer and a new question; turn ``k`` arrives ``k * think_s`` seconds in, so
  the previous turn has been computed (and cached) when it comes.

Lengths are drawn from ``random.Random(seed)`` and prompt ids from a second generator
seeded from the same seed, so the lengths do not depend on the model's vocabulary: the
same arguments give the same lengths on any model, and the same workload anywhere.

What a request and a workload are, the length and arrival-time generators and the
arrival loop are in ``minicb/workload.py``; a ``Workload`` may be given arrival times
there (``with_arrivals``, ``arrival_times``).

Also here, since it is the same question (what the suite runs), asked at one size: the
suite's plan. The systems by name; ``QUICK`` and ``FULL``, the suite's two sizes, chosen
for the 2-core CPU machine with the default 135M model (a decode step of 16 requests takes
0.1 to 0.2 s): ``--quick`` takes a minute or two, the full suite 15 to 25 minutes. A
``BenchPlan`` holds every size and limit of one suite; ``make_workloads``,
``cache_workloads`` and ``sweep_workload`` draw the recipes above at its size.
docs/performance.md writes every workload out exactly. Pure Python.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from minicb.workload import RequestSpec, Workload, exponential_lengths


# ---- the recipes ----------------------------------------------------------------------
def _workload(
    name: str, lengths: list[tuple[int, int]], vocab: int, seed: int, description: str,
    params: dict, temperature: float = 0.0, low: int = 3,
) -> Workload:  # fmt: skip
    """Requests of the drawn (prompt, output) ``lengths``. Prompt ids are uniform in
    [low, min(10000, vocab - 1)] (ids below 3 are often special), from a generator of
    their own, so that the vocabulary never shifts a length."""
    ids, top = random.Random(f"minicb-bench-prompt-ids-{seed}"), max(low, min(10000, vocab - 1))
    reqs = [RequestSpec([ids.randint(low, top) for _ in range(p)], out) for p, out in lengths]
    return Workload(name, f"{description}, seed {seed}", reqs, temperature, seed, params=params)


def capped_exponential(
    n: int, prompt_len: int, mean_output: float, cap: int, vocab: int, seed: int = 0
) -> Workload:
    """Output length = min(cap, max(1, round(X))), X ~ Exponential(mean ``mean_output``)."""
    lengths = [(prompt_len, out) for out in exponential_lengths(n, mean_output, cap, seed)]
    description = (
        f"{n} requests, prompts of {prompt_len} random tokens, output lengths "
        f"min({cap}, max(1, round(X))) with X exponential of mean {mean_output} "
        f"(Anyscale's method)"
    )
    params = dict(n=n, prompt_len=prompt_len, mean_output=mean_output, cap=cap)
    return _workload("capped-exp", lengths, vocab, seed, description, params)


def uniform_lengths(
    n: int, prompt_range: tuple[int, int], output_range: tuple[int, int], vocab: int, seed: int = 0
) -> Workload:
    """Prompt and output lengths drawn uniformly from inclusive integer ranges (Orca's),
    prompt length then output length, request after request."""
    rng = random.Random(seed)
    lengths = [(rng.randint(*prompt_range), rng.randint(*output_range)) for _ in range(n)]
    description = (
        f"{n} requests, prompt lengths uniform in {list(prompt_range)}, output lengths "
        f"uniform in {list(output_range)} (Orca's workload, scaled)"
    )
    params = dict(n=n, prompt_range=list(prompt_range), output_range=list(output_range))
    return _workload("uniform", lengths, vocab, seed, description, params)


def nanovllm_replica(
    n: int, length_range: tuple[int, int], vocab: int, seed: int = 0, temperature: float = 0.6
) -> Workload:
    """nano-vllm's bench.py scaled down: ids in [0, 10000], both lengths in one range, all
    prompt lengths drawn first."""
    rng = random.Random(seed)
    prompts = [rng.randint(*length_range) for _ in range(n)]
    lengths = [(p, rng.randint(*length_range)) for p in prompts]
    description = (
        f"{n} requests, prompt and output lengths uniform in {list(length_range)}, random "
        f"ids in [0, {min(10000, vocab - 1)}], temperature {temperature}, ignore_eos "
        f"(nano-vllm's bench.py: 256 requests, lengths in [100, 1024])"
    )
    params = dict(n=n, length_range=list(length_range))
    return _workload("nanovllm", lengths, vocab, seed, description, params, temperature, low=0)


def fixed_lengths(n: int, prompt_len: int, output_len: int, vocab: int, seed: int = 0) -> Workload:
    """Every request alike: continuous batching should win nothing here."""
    description = (
        f"{n} requests, prompts of {prompt_len} random tokens, exactly {output_len} output "
        f"tokens each (the control)"
    )
    params = dict(n=n, prompt_len=prompt_len, output_len=output_len)
    return _workload("fixed", [(prompt_len, output_len)] * n, vocab, seed, description, params)


def shared_system_prompt(
    n: int, system_len: int, question_range: tuple[int, int], output_len: int, vocab: int,
    seed: int = 0,
) -> Workload:  # fmt: skip
    """Every prompt: the same ``system_len`` tokens, then a question of its own."""
    rng = random.Random(seed)
    lengths = [(system_len + rng.randint(*question_range), output_len) for _ in range(n)]
    w = _workload(
        "shared-system",
        lengths,
        vocab,
        seed,
        f"{n} requests, one {system_len}-token system prompt then a question of "
        f"{list(question_range)} tokens, {output_len} output tokens each",
        dict(
            n=n, system_len=system_len, question_range=list(question_range), output_len=output_len
        ),
    )
    system = w.requests[0].prompt[:system_len]
    reqs = [replace(r, prompt=system + r.prompt[system_len:]) for r in w.requests]
    return replace(w, requests=reqs)


def multi_turn_chat(
    conversations: int, turns: int, turn_len: int, output_len: int, vocab: int,
    think_s: float = 1.0, seed: int = 0,
) -> Workload:  # fmt: skip
    """Each turn's prompt = the previous turn's prompt + ``turn_len`` new tokens (an answer
    and a question); turn ``k`` of every conversation arrives at ``k * think_s``."""
    n = conversations * turns
    w = _workload(
        "multi-turn",
        [(turn_len, output_len)] * n,
        vocab,
        seed,
        f"{conversations} conversations of {turns} turns, each turn {turn_len} tokens "
        f"longer than the last, {output_len} output tokens, a turn every {think_s:g} s",
        dict(conversations=conversations, turns=turns, turn_len=turn_len, output_len=output_len),
    )
    reqs = []
    for c in range(conversations):
        prompt: list[int] = []
        for k in range(turns):
            prompt = prompt + w.requests[c * turns + k].prompt
            reqs.append(RequestSpec(prompt, output_len, arrival=k * think_s))
    reqs.sort(key=lambda r: r.arrival)
    return replace(w, requests=reqs, arrivals=f"turn k at k x {think_s:g} s")


# ---- the suite's plan: its systems, its two sizes, its workloads at each size --------------
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
