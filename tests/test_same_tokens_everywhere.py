"""The central invariant: the same prompts give the same greedy tokens whatever the
batching mode, chunk size, block size, policy or preemption.

Breadth runs on a tiny random Llama (fast, every combination); depth on the default model
(a smaller set). Where preemption is the point, the test asserts that it really happened.
"""

import pytest

from minicb import LLM, LLMEngine, SamplingParams
from tests.helpers import greedy_tokens, mixed_prompts

PROMPTS = mixed_prompts(16, vocab=256, seed=3, min_len=1, max_len=40)
MAX_TOKENS = [
    4 + (7 * i) % 23 for i in range(16)
]  # varied lengths: requests leave at different steps


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    """One request at a time: no batching at all."""
    llm = LLM(
        model=tiny_llama_dir, dtype="float32", max_num_seqs=1, num_kv_blocks=64, block_size=16
    )
    return greedy_tokens(llm, PROMPTS, MAX_TOKENS)


CONFIGS = {
    "continuous": dict(),
    "static": dict(batching="static"),
    "chunk-1": dict(max_num_batched_tokens=1),
    "chunk-3": dict(max_num_batched_tokens=3),
    "chunk-16": dict(max_num_batched_tokens=16),
    "unlimited": dict(max_num_batched_tokens=100_000),
    "no-chunking": dict(enable_chunked_prefill=False),
    "block-1": dict(block_size=1, num_kv_blocks=4096),
    "priority": dict(policy="priority", aging_steps=2),
    "static-priority": dict(batching="static", policy="priority"),
    # Small batches, so sorting by length really regroups the requests.
    "static-arrival-4": dict(batching="static", max_num_seqs=4),
    "static-length-4": dict(batching="static", max_num_seqs=4, static_order="length"),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_same_tokens(name, tiny_llama_dir, reference):
    options = dict(num_kv_blocks=256, block_size=16) | CONFIGS[name]
    llm = LLM(model=tiny_llama_dir, dtype="float32", **options)
    priorities = [i % 3 for i in range(len(PROMPTS))]
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]
    outs = llm.generate(PROMPTS, params, priorities=priorities)
    assert [o.token_ids for o in outs] == reference


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_same_tokens_under_preemption(mode, policy, block_size, tiny_llama_dir, reference):
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
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]
    outs = llm.generate(PROMPTS, params, priorities=[i % 3 for i in range(len(PROMPTS))])
    assert [o.token_ids for o in outs] == reference
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    llm.engine.scheduler.blocks.check()  # the block manager's own invariants
    assert llm.engine.kv_snapshot().num_used == 0


def test_swap_falls_back_to_recompute_when_swap_space_is_full(tiny_llama_dir, reference):
    llm = LLM(
        dtype="float32",
        model=tiny_llama_dir,
        num_kv_blocks=6,
        block_size=16,
        preemption_mode="swap",
        num_swap_blocks=0,
        max_num_batched_tokens=32,
    )
    seen_modes = set()
    swap_copies = []

    def watch(event):
        seen_modes.update(d.mode for d in event.plan.preempted)
        swap_copies.extend(event.plan.swap_out_map)

    llm.engine.bus.subscribe(watch, kinds=["step"])
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == reference
    assert seen_modes == {"recompute"}
    assert not swap_copies


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        dict(batching="static"),
        dict(max_num_batched_tokens=5),
        dict(num_kv_blocks=5, preemption_mode="recompute", max_num_batched_tokens=64),
        dict(num_kv_blocks=5, preemption_mode="swap", max_num_batched_tokens=64, policy="priority"),
    ],
    ids=["static", "chunk-5", "recompute", "swap-priority"],
)
def test_same_tokens_on_default_model(options, default_llm):
    prompts = [
        "The capital of France is",
        "Once upon a time",
        "def add(a, b):",
        "Water boils at",
        "1, 2, 3,",
    ]
    expected = greedy_tokens(default_llm, prompts, 24)
    llm = LLM(dtype="float32", block_size=16, **({"num_kv_blocks": 64} | options))
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in outs] == expected
    if "preemption_mode" in options:
        assert sum(o.metrics.num_preemptions for o in outs) > 0


# ---- prefix caching: the same tokens with caching on as off --------------------------------
def _shared_prompts() -> list[list[int]]:
    """Prompts that share prefixes: a common 37-token "system prompt" with varied tails,
    chat turns that each extend the previous turn, a repeated prompt (wholly cached), and
    one exactly two blocks long (every block cached, yet a token must be computed)."""
    system = mixed_prompts(1, vocab=256, seed=11, min_len=37, max_len=37)[0]
    tails = mixed_prompts(6, vocab=256, seed=12, min_len=1, max_len=12)
    turns = [system[:5]]
    for extra in mixed_prompts(4, vocab=256, seed=13, min_len=3, max_len=14):
        turns.append(turns[-1] + extra)
    return [system + t for t in tails] + turns + [system + tails[0], system[:32], system[:32]]


SHARED = _shared_prompts()
SHARED_MAX = [3 + (5 * i) % 17 for i in range(len(SHARED))]


@pytest.fixture(scope="module")
def shared_reference(tiny_llama_dir):
    llm = LLM(
        dtype="float32",
        model=tiny_llama_dir,
        max_num_seqs=1,
        num_kv_blocks=64,
        block_size=16,
        enable_prefix_caching=False,
    )
    return greedy_tokens(llm, SHARED, SHARED_MAX)


def _cached_run(llm: LLM) -> tuple[list[list[int]], int]:
    """Greedy tokens of SHARED, all arriving at once (the requests admitted after the first
    ones have run find their blocks), and the prompt tokens the cache supplied."""
    hits = []
    llm.engine.bus.subscribe(lambda e: hits.append(e.plan.prefix_hit_tokens), kinds=["step"])
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
    preemptions = []
    llm.engine.bus.subscribe(lambda e: preemptions.extend(e.plan.preempted), kinds=["step"])
    tokens, hit_tokens = _cached_run(llm)
    assert tokens == shared_reference
    assert hit_tokens > 0 and preemptions


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(max_num_batched_tokens=5),
        dict(num_kv_blocks=5, preemption_mode="recompute", max_num_batched_tokens=64),
        dict(num_kv_blocks=5, preemption_mode="swap", max_num_batched_tokens=64, policy="priority"),
    ],
    ids=["continuous", "chunk-5", "recompute", "swap-priority"],
)
def test_same_tokens_with_prefix_caching_on_default_model(options, default_llm):
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
    llm.engine.bus.subscribe(lambda e: hits.append(e.plan.prefix_hit_tokens), kinds=["step"])
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in outs] == expected
    assert sum(hits) > 0
    if "preemption_mode" in options:
        assert sum(o.metrics.num_preemptions for o in outs) > 0
