"""Tensor parallelism on CPU: two processes (gloo, fp32, spawn) give the tokens and logits
of one.

Every supported architecture runs on a tiny random config, plus one with fewer KV heads
than ranks (each KV head replicated); then chunked prefill, preemption by recompute and by
swap, and static batching on the tiny Llama. The two-rank group starts once, on first use,
and is shared by every engine of this module (one process holds one group); it is shut
down when the module ends.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
import torch

from minicb import LLM, EngineConfig, SamplingParams
from minicb.core.runner.build_model import model_config
from minicb.core.runner.loader import iter_safetensors, open_model
from minicb.engine_options import add_engine_options, engine_kwargs
from minicb.parallel import tp_group
from minicb.parallel.settings import ParallelSettings
from minicb.parallel.tensor_parallel import iter_shard, shard_config
from minicb.tiny_models import TINY_ARCHITECTURES, make_tiny_model_dir, tiny_hf_config
from tests.helpers import greedy_tokens, mixed_prompts

PROMPTS = mixed_prompts(6, vocab=256, seed=5, min_len=1, max_len=30)
MAX_TOKENS = [3 + (5 * i) % 9 for i in range(len(PROMPTS))]
MODELS = {arch: {} for arch in TINY_ARCHITECTURES} | {"llama-1kv": {"num_key_value_heads": 1}}


@pytest.fixture(scope="module", autouse=True)
def _one_group_per_module():
    yield
    tp_group.shutdown_group()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_models")
    return {
        name: str(make_tiny_model_dir(name.split("-")[0], root / name, seed=1, **extra))
        for name, extra in MODELS.items()
    }


def _run(path: str, tp: int, **options):
    """Greedy tokens of PROMPTS and the logits of every sampling row, in step order."""
    llm = LLM(dtype="float32", model=path, tensor_parallel_size=tp, num_kv_blocks=64, **options)
    model, seen = llm.engine.runner.model, []
    real = model.logits

    def recording(hidden):
        logits = real(hidden)
        seen.append(logits.clone())
        return logits

    model.logits = recording
    tokens = greedy_tokens(llm, PROMPTS, MAX_TOKENS)
    return tokens, torch.cat(seen), llm


@pytest.mark.parametrize("name", MODELS)
def test_two_ranks_give_the_tokens_and_logits_of_one(name, model_dirs):
    tokens_1, logits_1, _ = _run(model_dirs[name], 1)
    tokens_2, logits_2, llm = _run(model_dirs[name], 2)
    assert tokens_2 == tokens_1
    assert logits_2.shape == logits_1.shape
    torch.testing.assert_close(logits_2, logits_1, atol=1e-4, rtol=0)
    assert llm.engine.describe()["runner"]["tensor_parallel_size"] == 2


MODES = {
    "chunked-prefill": dict(max_num_batched_tokens=4),
    "static": dict(batching="static", max_num_seqs=3),
    # A pool of 6 blocks of 4 tokens for prompts of up to 40 tokens: preemption is forced.
    "recompute": dict(num_kv_blocks=10, block_size=4, max_num_batched_tokens=16),
    "swap": dict(
        num_kv_blocks=10,
        block_size=4,
        max_num_batched_tokens=16,
        preemption_mode="swap",
        num_swap_blocks=10,
    ),
}


@pytest.mark.parametrize("mode", MODES)
def test_same_tokens_in_every_mode(mode, model_dirs):
    path, options = model_dirs["llama"], MODES[mode]
    reference = _run(path, 1)[0]
    engine = LLM(
        dtype="float32", model=path, tensor_parallel_size=2, **({"num_kv_blocks": 64} | options)
    ).engine
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]
    ids = [engine.add_request(p, s) for p, s in zip(PROMPTS, params, strict=True)]
    preempted, done = 0, {}
    while engine.has_unfinished():
        result = engine.step()
        preempted += len(result.plan.preempted)
        done |= {o.request_id: o.token_ids for o in result.finished}
    assert [done[i] for i in ids] == reference
    if mode in ("recompute", "swap"):
        assert preempted > 0
    assert engine.kv_snapshot().num_used == 0


# Prompts that repeat themselves, beside the random ones: the n-gram lookup finds drafts.
SPEC_PROMPTS = PROMPTS + [[7, 8, 9, 10, 11, 12] * 5, [40, 41, 42] * 9 + [40]]
SPEC_MAX_TOKENS = MAX_TOKENS + [20, 16]


def test_two_ranks_with_speculation_give_the_tokens_of_one_without(model_dirs):
    path = model_dirs["llama"]
    plain = LLM(dtype="float32", model=path, num_kv_blocks=64)
    reference = greedy_tokens(plain, SPEC_PROMPTS, SPEC_MAX_TOKENS)
    spec = dict(speculative="ngram", num_speculative_tokens=4)
    llm = LLM(dtype="float32", model=path, tensor_parallel_size=2, num_kv_blocks=64, **spec)
    accepted = []
    llm.engine.bus.subscribe(
        lambda es: accepted.extend(e.plan.num_accepted_tokens for e in es), kinds=["step"]
    )
    assert greedy_tokens(llm, SPEC_PROMPTS, SPEC_MAX_TOKENS) == reference
    assert sum(accepted) > 0  # drafts were verified on both ranks and some were kept
    assert llm.engine.kv_snapshot().num_used == 0


def test_compile_on_runs_eager_under_tensor_parallelism_and_says_why(model_dirs):
    # The layers' all-reduces would sit inside the compiled decode graph: every rank eager.
    # (The compiled step is the performance lab's runner, perflab/compiled.py, wrapping rank
    # 0's model runner; here because it needs this module's two-rank group.)
    from minicb import LLMEngine
    from perflab.compiled import CompiledRunner

    path = model_dirs["llama"]
    llm = LLM(dtype="float32", model=path, tensor_parallel_size=2, num_kv_blocks=64)
    runner = CompiledRunner(llm.engine.runner)
    llm.engine = LLMEngine(config=llm.engine.config, runner=runner)
    assert runner.decode is None
    expected = (
        "eager: the compiled decode step needs tensor_parallel_size 1 and kv_cache_dtype auto"
    )
    assert llm.engine.runner.describe()["compile"] == expected
    assert greedy_tokens(llm, PROMPTS, MAX_TOKENS) == _run(path, 1)[0]


def test_the_step_event_carries_the_degree_and_the_collective_time(model_dirs):
    llm = LLM(dtype="float32", model=model_dirs["llama"], tensor_parallel_size=2, num_kv_blocks=64)
    seen = []
    llm.engine.bus.subscribe(seen.extend, kinds=("step",))
    greedy_tokens(llm, PROMPTS[:2], 2)
    assert seen and all(e.tensor_parallel_size == 2 for e in seen)
    assert all(0.0 < e.collective_s for e in seen)


def test_a_second_engine_on_the_same_weights_shares_the_shards(model_dirs):
    llm = LLM(dtype="float32", model=model_dirs["llama"], tensor_parallel_size=2, num_kv_blocks=64)
    static = llm.engine.rebuilt(llm.engine.config.with_(batching="static"))
    assert static.runner.model is llm.engine.runner.model
    reference = _run(model_dirs["llama"], 1)[0]
    for rid, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        assert static.add_request(p, SamplingParams(max_tokens=m, temperature=0.0)) == rid
    outs = sorted(static.run_until_done(), key=lambda o: o.request_id)
    assert [o.token_ids for o in outs] == reference


def test_a_split_that_does_not_divide_is_refused_naming_the_limit(model_dirs):
    cfg = model_config(tiny_hf_config("llama"))  # 4 heads, 2 KV heads, MLP 128
    assert shard_config(cfg, 4).num_kv_heads == 1  # each KV head on two ranks
    with pytest.raises(ValueError, match="must divide the 4 attention heads"):
        shard_config(cfg, 3)
    with pytest.raises(ValueError, match="divide the 3 KV heads, or be a multiple of them"):
        shard_config(dataclasses.replace(cfg, num_kv_heads=3), 2)
    with pytest.raises(ValueError, match="must divide the MLP width 128"):
        shard_config(dataclasses.replace(cfg, num_heads=6, num_kv_heads=2), 6)
    with pytest.raises(ValueError, match="must divide the 4 attention heads"):
        LLM(
            dtype="float32", model=model_dirs["llama"], tensor_parallel_size=3
        )  # refused before any spawn


@pytest.mark.parametrize("name", ["qwen2", "llama-1kv"])  # q/k/v biases; one KV head
def test_each_rank_reads_only_its_slices_and_together_they_make_the_whole(name, model_dirs):
    path = Path(model_dirs[name])
    cfg = model_config(open_model(path).hf_config)
    full = dict(iter_safetensors(path))
    ranks = [dict(iter_shard(path, cfg, rank, 2, set(full))) for rank in range(2)]
    for tensor_name, tensor in full.items():
        parts = [r[tensor_name] for r in ranks]
        module = tensor_name.split(".")[-2]
        if module in ("o_proj", "down_proj"):
            assert torch.equal(torch.cat(parts, dim=1), tensor), tensor_name
        elif module in ("q_proj", "gate_proj", "up_proj") or (
            module in ("k_proj", "v_proj") and cfg.num_kv_heads >= 2
        ):
            assert torch.equal(torch.cat(parts, dim=0), tensor), tensor_name
        else:  # norms, embedding, LM head, and a single KV head: every rank has it all
            assert all(torch.equal(p, tensor) for p in parts), tensor_name
    assert (
        ranks[0]["model.layers.0.self_attn.q_proj.weight"].shape[0]
        == cfg.num_heads // 2 * cfg.head_dim
    )


@pytest.mark.slow
def test_the_default_model_on_three_ranks(default_llm):
    # SmolLM2-135M has 9 attention heads and 3 KV heads: 3 ranks is its smallest split.
    prompts = ["The capital of France is", "def fibonacci(n):"]
    reference = greedy_tokens(default_llm, prompts, 8)
    llm = LLM(dtype="float32", tensor_parallel_size=3, num_kv_blocks=64)
    assert greedy_tokens(llm, prompts, 8) == reference


def test_the_degree_is_an_engine_option_and_a_command_line_option():
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    args = parser.parse_args(["--tensor-parallel-size", "2"])
    config = EngineConfig.from_kwargs(**engine_kwargs(args))
    assert ParallelSettings.of(config).tensor_parallel_size == 2
    assert ParallelSettings.of(EngineConfig()).tensor_parallel_size == 1
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive integer"):
        EngineConfig.from_kwargs(tensor_parallel_size=0)
