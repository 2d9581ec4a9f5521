"""The central invariant: the same prompts give the same greedy tokens whatever the
batching mode, chunk size, block size, policy or preemption.

Breadth runs on a tiny random Llama (fast, every combination); depth on the default model
(a smaller set). Where preemption is the point, the test asserts that it really happened.
"""

import pytest

from minicb import LLM, LLMEngine, SamplingParams
from tests.helpers import MIXED, MIXED_MAX, SHARED, SHARED_MAX, greedy_tokens

PRIORITIES = [i % 3 for i in range(len(MIXED))]

# Each configuration must make a schedule of its own (asserted below): where the default
# limits would never bind on these 16 short prompts, the configuration tightens them.
CONFIGS = {
    "budget-64": dict(max_num_batched_tokens=64),
    "static": dict(batching="static"),
    "chunk-1": dict(max_num_batched_tokens=1),
    "chunk-3": dict(max_num_batched_tokens=3),
    "chunk-16": dict(max_num_batched_tokens=16),
    "unlimited": dict(max_num_batched_tokens=100_000),
    "no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=80),
    # A pool of 400 one-token blocks: requests wait for blocks a few tokens at a time.
    "block-1": dict(block_size=1, num_kv_blocks=400),
    # Four slots, so the policy decides who goes first (asserted: priority 0 does).
    "priority": dict(policy="priority", aging_steps=2, max_num_seqs=4),
    "static-priority": dict(batching="static", policy="priority", max_num_seqs=4),
    # Small batches, so sorting by length really regroups the requests.
    "static-arrival-4": dict(batching="static", max_num_seqs=4),
    "static-length-4": dict(batching="static", max_num_seqs=4, static_order="length"),
}


def record_plans(llm: LLM) -> list:
    """Subscribe to ``llm``'s step events; the list fills with every step's plan."""
    plans: list = []
    llm.engine.bus.subscribe(lambda es: plans.extend(e.plan for e in es), kinds=["step"])
    return plans


def schedule_of(plans: list) -> tuple:
    """What the scheduler decided, step by step: (request, phase, tokens) rows."""
    return tuple(tuple((r.request_id, r.phase, r.num_tokens) for r in p.scheduled) for p in plans)


def first_admissions(plans: list) -> list[int]:
    """Request ids in the order they were first admitted (a preempted one comes back later)."""
    order: list[int] = []
    for plan in plans:
        order += [d.request_id for d in plan.admitted if d.request_id not in order]
    return order


def generate(llm: LLM, prompts, max_tokens: list[int], priorities: list[int]) -> list:
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]
    return llm.generate(prompts, params, priorities=priorities)


@pytest.fixture(scope="module")
def runs(tiny_llama_dir) -> dict:
    """Every configuration run once: its outputs and the plans of its steps."""
    results = {}
    for name, config in CONFIGS.items():
        options = dict(num_kv_blocks=256, block_size=16) | config
        llm = LLM(model=tiny_llama_dir, dtype="float32", **options)
        plans = record_plans(llm)
        results[name] = (generate(llm, MIXED, MIXED_MAX, PRIORITIES), plans)
    return results


@pytest.mark.parametrize("name", CONFIGS)
def test_same_tokens(name, runs, mixed_reference):
    outs, plans = runs[name]
    assert [o.token_ids for o in outs] == mixed_reference
    prio = {o.request_id: p for o, p in zip(outs, PRIORITIES, strict=True)}
    order = first_admissions(plans)
    assert sorted(order) == sorted(prio)
    if CONFIGS[name].get("policy") == "priority":
        # The policy reordered: the four slots went to priority-0 requests first.
        assert [prio[r] for r in order[:4]] == [0, 0, 0, 0]
        assert order != sorted(order)
    elif CONFIGS[name].get("static_order") != "length":
        assert order == sorted(order)  # first come, first served


def test_every_configuration_schedules_differently(runs):
    """No configuration repeats another's schedule: each exercises a mode of its own."""
    schedules = {name: schedule_of(plans) for name, (_, plans) in runs.items()}
    same = [(a, b) for a in schedules for b in schedules if a < b and schedules[a] == schedules[b]]
    assert not same


def assert_preempted_as(plans: list, mode: str) -> None:
    """Preemption happened in ``mode`` (swap falls back to recompute when the swap space is
    full, recompute never swaps); swapped-out requests were swapped back in."""
    modes = {d.mode for p in plans for d in p.preempted}
    assert mode in modes and modes <= {"swap", "recompute"}
    if mode == "recompute":
        assert modes == {"recompute"}
    swapped_out = [d.request_id for p in plans for d in p.swapped_out]
    swapped_in = [d.request_id for p in plans for d in p.swapped_in]
    assert sorted(swapped_out) == sorted(swapped_in)
    assert bool(swapped_out) == (mode == "swap")


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_same_tokens_under_preemption(mode, policy, block_size, tiny_llama_dir, mixed_reference):
    # A pool of ~70 tokens for 16 requests of up to 62 tokens each: preemption is forced.
    num_blocks = 72 // block_size
    llm = LLM(
        dtype="float32",
        model=tiny_llama_dir,
        num_kv_blocks=num_blocks,
        block_size=block_size,
        preemption_mode=mode,
        policy=policy,
        max_num_batched_tokens=32,
        num_swap_blocks=num_blocks,
    )
    plans = record_plans(llm)
    outs = generate(llm, MIXED, MIXED_MAX, PRIORITIES)
    assert [o.token_ids for o in outs] == mixed_reference
    assert_preempted_as(plans, mode)
    order = first_admissions(plans)
    assert (order == sorted(order)) == (policy == "fcfs")
    llm.engine.scheduler.blocks.check()  # the block manager's own invariants
    assert llm.engine.kv_snapshot().num_used == 0


def test_swap_falls_back_to_recompute_when_swap_space_is_full(tiny_llama_dir, mixed_reference):
    llm = LLM(
        dtype="float32",
        model=tiny_llama_dir,
        num_kv_blocks=6,
        block_size=16,
        preemption_mode="swap",
        num_swap_blocks=0,
        max_num_batched_tokens=32,
    )
    plans = record_plans(llm)
    outs = generate(llm, MIXED, MIXED_MAX, PRIORITIES)
    assert [o.token_ids for o in outs] == mixed_reference
    assert_preempted_as(plans, "recompute")
    assert not [pair for p in plans for pair in p.swap_out_map]


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        dict(batching="static"),
        dict(num_kv_blocks=5, preemption_mode="swap", max_num_batched_tokens=5, policy="priority"),
    ],
    ids=["static", "chunk-5-swap-priority"],
)
def test_same_tokens_on_default_model(options, default_llm):
    """Depth: the real model, static, and continuous with every mode at once (the breadth of
    modes, each alone and recompute included, runs on the tiny model above)."""
    prompts = [
        "The capital of France is",
        "Once upon a time",
        "def add(a, b):",
        "Water boils at",
        "1, 2, 3,",
    ]
    expected = greedy_tokens(default_llm, prompts, 24)
    llm = LLM(dtype="float32", block_size=16, **({"num_kv_blocks": 64} | options))
    plans = record_plans(llm)
    outs = generate(llm, prompts, [24] * len(prompts), priorities=[2, 1, 0, 1, 0])
    assert [o.token_ids for o in outs] == expected
    if "preemption_mode" in options:
        assert_preempted_as(plans, options["preemption_mode"])
    if options.get("policy") == "priority":
        assert first_admissions(plans)[:2] == [2, 4]  # the priority-0 requests first


# ---- prefix caching: the same tokens with caching on as off --------------------------------
def _cached_run(llm: LLM) -> tuple[list[list[int]], int]:
    """Greedy tokens of SHARED, all arriving at once (the requests admitted after the first
    ones have run find their blocks), and the prompt tokens the cache supplied."""
    hits = []
    llm.engine.bus.subscribe(
        lambda es: hits.extend(e.plan.prefix_hit_tokens for e in es), kinds=["step"]
    )
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in SHARED_MAX]
    outs = llm.generate(SHARED, params, priorities=[i % 3 for i in range(len(SHARED))])
    llm.engine.scheduler.blocks.check()
    assert llm.engine.kv_snapshot().num_used == 0
    return [o.token_ids for o in outs], sum(hits)


@pytest.mark.parametrize("name", CONFIGS)
def test_same_tokens_with_prefix_caching(name, tiny_llama_dir, shared_reference):
    options = dict(num_kv_blocks=256, block_size=16, max_num_seqs=4) | CONFIGS[name]
    llm = LLM(model=tiny_llama_dir, dtype="float32", enable_prefix_caching=True, **options)
    tokens, hit_tokens = _cached_run(llm)
    assert tokens == shared_reference
    # Static batching does not share prefixes (see docs/architecture.md); the rest must.
    assert (hit_tokens > 0) == (CONFIGS[name].get("batching") != "static")


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_same_tokens_with_prefix_caching_under_preemption(
    mode, policy, block_size, tiny_llama_dir, shared_reference
):
    num_blocks = 96 // block_size  # 96 tokens for prompts of up to 49 + 19: preemption
    llm = LLM(
        dtype="float32",
        model=tiny_llama_dir,
        num_kv_blocks=num_blocks,
        block_size=block_size,
        preemption_mode=mode,
        policy=policy,
        max_num_batched_tokens=32,
        num_swap_blocks=num_blocks,
        enable_prefix_caching=True,
    )
    plans = record_plans(llm)
    tokens, hit_tokens = _cached_run(llm)
    assert tokens == shared_reference
    assert hit_tokens > 0
    assert_preempted_as(plans, mode)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        dict(num_kv_blocks=5, preemption_mode="swap", max_num_batched_tokens=16, policy="priority"),
    ],
    ids=["chunk-16-swap-priority"],
)
def test_same_tokens_with_prefix_caching_on_default_model(options, default_llm):
    """Depth: the real model, with chunks, swap and priority at once (breadth: tiny model)."""
    system = "You are a helpful assistant who answers in one short sentence. Question: "
    prompts = [system + q for q in ("What is water?", "Why is the sky blue?", "Who was Ada?")]
    prompts += [prompts[0], system + "What is water? Answer simply."]
    config = default_llm.engine.config.with_(enable_prefix_caching=False)
    plain = LLMEngine(config=config, runner=default_llm.engine.runner.with_config(config))
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    for p in prompts:
        plain.add_request(p, params)
    expected = [o.token_ids for o in sorted(plain.run_until_done(), key=lambda o: o.request_id)]
    llm = LLM(
        dtype="float32",
        block_size=16,
        enable_prefix_caching=True,
        max_num_seqs=2,
        **({"num_kv_blocks": 64} | options),
    )
    hits = []
    llm.engine.bus.subscribe(
        lambda es: hits.extend(e.plan.prefix_hit_tokens for e in es), kinds=["step"]
    )
    plans = record_plans(llm)
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in outs] == expected
    assert sum(hits) > 0
    if "preemption_mode" in options:
        assert_preempted_as(plans, options["preemption_mode"])
