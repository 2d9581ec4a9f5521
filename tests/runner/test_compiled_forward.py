"""The compiled forward (minicb.runner.compiled) against eager: the same greedy tokens, a
bounded number of graphs whatever the token counts, and a clean fallback.

Fast tests compile with Dynamo's "eager" backend (the same graphs, captured and guarded,
without Inductor's C++ code generation, which takes tens of seconds), on every tiny
architecture; the slow ones run Inductor itself on one tiny model and on the default model.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.utils import counters

from minicb import LLM, SamplingParams
from minicb.runner import compiled, model_runner
from minicb.runner.loader import TINY_ARCHITECTURES, make_tiny_model_dir

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 6, 7], [9] * 20, list(range(3, 40)), [11]]


def tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, GREEDY)]


@pytest.fixture
def dynamo_eager(monkeypatch):
    """Runners built in the test compile with Dynamo's eager backend."""
    fast = functools.partial(compiled.CompiledLayers, backend="eager")
    monkeypatch.setattr(model_runner, "CompiledLayers", fast)


def test_compiled_tokens_equal_eager_and_graphs_are_built_once(tiny_llama_dir, dynamo_eager):
    torch._dynamo.reset()
    eager = tokens(LLM(model=tiny_llama_dir, num_kv_blocks=64, compile="off"))
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64, compile="on", max_num_batched_tokens=16)
    assert llm.engine.runner.describe()["compile"] == "compiled"
    before = counters["stats"]["unique_graphs"]
    assert tokens(llm) == eager  # chunks of 16, mixed steps, decode batches of 4 down to 1
    tokens(llm, [[3, 4]])  # one request alone: single-token steps
    # Per function: the first token count seen, then one graph for any count >= 2 and one
    # for a single token (Dynamo specialises sizes 0 and 1).
    built = counters["stats"]["unique_graphs"] - before
    assert 4 <= built <= 6
    tokens(llm, [[7] * 13, [8, 9], [1, 2, 3, 4, 5]])  # new token counts, batch sizes, lengths
    tokens(llm, [list(range(1, 50))])
    assert counters["stats"]["unique_graphs"] - before == built  # no recompile


def test_engine_runs_eager_when_torch_compile_is_unavailable(tiny_llama_dir, monkeypatch, caplog):
    def unavailable(*args, **kwargs):
        raise RuntimeError("torch.compile is not supported on this platform")

    monkeypatch.setattr(torch, "compile", unavailable)
    eager = tokens(LLM(model=tiny_llama_dir, num_kv_blocks=64, compile="off"))
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64, compile="on")
    assert tokens(llm) == eager
    described = llm.engine.runner.describe()["compile"]
    assert described == "eager: torch.compile failed: RuntimeError: " + (
        "torch.compile is not supported on this platform"
    )
    assert sum("running the model eager" in r.message for r in caplog.records) == 1


def test_a_compiled_layer_that_fails_when_called_falls_back_once(tiny_llama_dir, caplog):
    layers = compiled.CompiledLayers(backend="eager")
    calls = []

    def broken(*args):
        calls.append(args)
        raise OSError("no working C++ compiler")

    layers._inputs = layers._output = broken
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64, compile="off")
    runner = llm.engine.runner
    eager = tokens(llm)
    runner.layer_fns = layers.functions()
    assert tokens(llm) == eager
    assert len(calls) == 1  # the first call failed; every later one went straight to eager
    assert layers.describe() == "eager: torch.compile failed: OSError: no working C++ compiler"
    assert sum("running the model eager" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_compiled_tokens_equal_eager_on_every_tiny_architecture(arch, tmp_path, dynamo_eager):
    path = str(make_tiny_model_dir(arch, tmp_path, seed=2))
    eager = tokens(LLM(model=path, num_kv_blocks=64, compile="off"))
    llm = LLM(model=path, num_kv_blocks=64, compile="on")
    assert tokens(llm) == eager
    assert llm.engine.runner.describe()["compile"] == "compiled"


def test_compiled_tokens_equal_eager_with_packed_bf16_layers(tiny_llama_dir, dynamo_eager):
    # The packed layers are an operator of their own, which the compiled graph calls.
    eager = tokens(LLM(model=tiny_llama_dir, num_kv_blocks=64, dtype="bfloat16"))
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64, dtype="bfloat16", compile="on")
    assert tokens(llm) == eager
    assert llm.engine.runner.describe()["compile"] == "compiled"


@pytest.mark.slow  # Inductor's C++ code generation: tens of seconds each
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bf16: packed layers, too
def test_inductor_tokens_equal_eager_on_a_tiny_model(dtype, tmp_path):
    path = str(make_tiny_model_dir("qwen3", tmp_path, seed=2))  # GQA, q/k norms
    eager = tokens(LLM(model=path, num_kv_blocks=64, dtype=dtype, compile="off"))
    llm = LLM(model=path, num_kv_blocks=64, dtype=dtype, compile="on")
    assert tokens(llm) == eager
    assert llm.engine.runner.describe()["compile"] == "compiled"


@pytest.mark.slow  # the default model, compiled by Inductor
def test_inductor_tokens_equal_eager_on_the_default_model(default_llm):
    prompts = [default_llm.tokenizer.encode(t) for t in ("The capital of France is", "def f(")]
    eager = tokens(default_llm, prompts)
    runner = default_llm.engine.runner
    saved = runner.layer_fns
    try:
        runner.layer_fns = compiled.CompiledLayers().functions()
        assert tokens(default_llm, prompts) == eager
    finally:
        runner.layer_fns = saved
