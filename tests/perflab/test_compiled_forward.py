"""The compiled decode step (perflab/compiled.py, a runner wrapping the model runner)
against eager: the same greedy tokens, two graphs whatever the batch sizes and lengths, the
store after the graph, and a clean fallback.

Fast tests compile with Dynamo's "eager" backend (the same graph, captured and guarded,
without Inductor's C++ code generation, which takes tens of seconds), on every tiny
architecture; the slow ones run Inductor with freezing on one tiny model and on the default
model (the default model's build, six to seven minutes, behind the ``perflab`` marker:
``make test-perflab``).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from minicb import LLM, LLMEngine, SamplingParams
from minicb.core.attention.torch_attention import DecodeIndex, decode_attention
from minicb.packing.packed import can_pack
from minicb.tiny_models import TINY_ARCHITECTURES, make_tiny_model_dir
from perflab import compiled, roofline

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 6, 7], [9] * 20, list(range(3, 40)), [11]]


def tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, GREEDY)]


def LLM_(model: str, compile: str = "off", **options) -> LLM:  # noqa: N802
    """``LLM(model=model, **options)``; ``compile="on"``: on the lab's compiled runner."""
    llm = LLM(model=model, **options)
    if compile == "on":
        wrap(llm, compiled.CompiledRunner(llm.engine.runner))
    return llm


def wrap(llm: LLM, runner: compiled.CompiledRunner) -> None:
    """``llm`` on ``runner`` from now on: a new engine on the wrapper, same config."""
    llm.engine = LLMEngine(config=llm.engine.config, runner=runner)


@pytest.fixture
def dynamo_eager(monkeypatch):
    """Runners built in the test compile with Dynamo's eager backend."""
    class EagerBackend(compiled.CompiledDecode):
        def __init__(self, model, backend="eager"):
            super().__init__(model, backend)

    monkeypatch.setattr(compiled, "CompiledDecode", EagerBackend)


def counting_runs(monkeypatch) -> list[int]:
    """Batch sizes of the decode steps that went through the compiled graph."""
    batches: list[int] = []
    run = compiled.CompiledDecode.run

    def counted(self, input_ids, *args):
        hidden = run(self, input_ids, *args)
        if hidden is not None:
            batches.append(len(input_ids))
        return hidden

    monkeypatch.setattr(compiled.CompiledDecode, "run", counted)
    return batches


@pytest.mark.slow  # Inductor builds graphs: over 5 s on an idle 2-core machine
def test_compiled_tokens_equal_eager_and_two_graphs_serve_every_step(
    tiny_llama_dir, dynamo_eager, monkeypatch
):
    torch._dynamo.reset()
    eager = tokens(LLM_(tiny_llama_dir, num_kv_blocks=64, compile="off"))
    llm = LLM_(tiny_llama_dir, num_kv_blocks=64, compile="on", max_num_batched_tokens=16)
    assert llm.engine.runner.describe()["compile"] == "compiled decode steps"
    batches = counting_runs(monkeypatch)
    before = counters["stats"]["unique_graphs"]
    assert tokens(llm) == eager  # chunks of 16 and mixed steps eager, decodes compiled
    tokens(llm, [[3, 4]])  # one request alone
    assert {4, 1} <= set(batches)  # decode batches of 4 down to 1 ran the graph
    # Built before the first decode step: one row, and any batch from 2 (Dynamo
    # specialises a size of 1), whatever the context lengths.
    assert counters["stats"]["unique_graphs"] - before == 2
    tokens(llm, [[7] * 13, [8, 9], [1, 2, 3, 4, 5]])  # new batch sizes and lengths
    tokens(llm, [list(range(1, 50))])
    assert counters["stats"]["unique_graphs"] - before == 2  # no recompile
    assert llm.engine.kv_snapshot().num_used == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("context", [1, 5, 9])
def test_the_graphs_one_row_attention_equals_eagers(dtype, context):
    # The one-row graph's attention, written out as sums, against eager's: store the new
    # key and value, then SDPA over the paged context (GQA: 4 query heads on 2 KV heads).
    torch.manual_seed(context)
    k_cache, v_cache = (torch.randn(8, 4, 2, 16).to(dtype) for _ in range(2))
    index = DecodeIndex.of_rows(torch.tensor([[5, 2, 7]]), torch.tensor([context]), context, 4)
    query = torch.randn(1, 4, 16).to(dtype)
    key, value = torch.randn(1, 2, 16).to(dtype), torch.randn(1, 2, 16).to(dtype)
    last = torch.tensor([context - 1])
    cache = compiled.ReadOnlyCache(index, last)
    cache.store_kv(key, value, k_cache, v_cache, None)
    out = cache.one_row_attention(query, *cache.contexts(k_cache, v_cache), scale=0.25)
    slot = index.slots[last]
    stored_k, stored_v = k_cache.clone(), v_cache.clone()
    stored_k.flatten(0, 1)[slot], stored_v.flatten(0, 1)[slot] = key, value
    expected = decode_attention(query, stored_k, stored_v, index, scale=0.25)
    torch.testing.assert_close(out, expected)  # the dtype's tolerance: bf16 rounds as eager's


def test_padding_rows_of_static_batching_store_nothing(tiny_llama_dir, dynamo_eager, monkeypatch):
    # Static batches keep finished rows as padding (slot -1): their recomputed token must not
    # overwrite a block handed to someone else.
    options = dict(num_kv_blocks=64, batching="static", max_num_seqs=4)
    eager = tokens(LLM_(tiny_llama_dir, compile="off", **options), PROMPTS)
    llm = LLM_(tiny_llama_dir, compile="on", **options)
    batches = counting_runs(monkeypatch)
    short = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, [short, GREEDY, GREEDY, short])
    assert [o.token_ids for o in outs] == [e[:2] if i in (0, 3) else e for i, e in enumerate(eager)]
    assert batches and set(batches) == {4}  # the padded batch went through the graph
    assert tokens(llm) == eager


def test_engine_runs_eager_when_torch_compile_is_unavailable(tiny_llama_dir, monkeypatch, caplog):
    def unavailable(*args, **kwargs):
        raise RuntimeError("torch.compile is not supported on this platform")

    monkeypatch.setattr(torch, "compile", unavailable)
    eager = tokens(LLM_(tiny_llama_dir, num_kv_blocks=64, compile="off"))
    llm = LLM_(tiny_llama_dir, num_kv_blocks=64, compile="on")
    assert tokens(llm) == eager
    described = llm.engine.runner.describe()["compile"]
    assert described == "eager: torch.compile failed: RuntimeError: " + (
        "torch.compile is not supported on this platform"
    )
    assert sum("running the model eager" in r.message for r in caplog.records) == 1


def test_a_compiled_decode_that_fails_when_called_falls_back_once(tiny_llama_dir, caplog):
    llm = LLM_(tiny_llama_dir, num_kv_blocks=64, compile="off")
    runner = llm.engine.runner
    eager = tokens(llm)
    decode = compiled.CompiledDecode(runner.model, backend="eager")
    calls = []

    def broken(*args):
        calls.append(args)
        raise OSError("no working C++ compiler")

    decode._graph = broken
    wrap(llm, compiled.CompiledRunner(runner, decode))
    assert tokens(llm) == eager
    assert len(calls) == 1  # the first call failed; every later step went straight to eager
    assert decode.describe() == "eager: torch.compile failed: OSError: no working C++ compiler"
    assert sum("running the model eager" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_compiled_tokens_equal_eager_on_every_tiny_architecture(arch, tmp_path, dynamo_eager):
    path = str(make_tiny_model_dir(arch, tmp_path, seed=2))
    eager = tokens(LLM_(path, num_kv_blocks=64, compile="off"))
    llm = LLM_(path, num_kv_blocks=64, compile="on")
    assert tokens(llm) == eager
    assert llm.engine.runner.describe()["compile"] == "compiled decode steps"


@pytest.mark.skipif(
    not can_pack(torch.device("cpu"), torch.bfloat16), reason="oneDNN cannot pack bf16 here"
)
def test_compiled_tokens_equal_eager_with_packed_bf16_layers(tiny_llama_dir, dynamo_eager):
    # Compiled, a packed layer hands its plain weight to the graph (freezing packs it there).
    eager = tokens(LLM_(tiny_llama_dir, num_kv_blocks=64, dtype="bfloat16"))
    llm = LLM_(tiny_llama_dir, num_kv_blocks=64, dtype="bfloat16", compile="on")
    assert llm.engine.runner.describe()["linear"] == "onednn-packed"
    assert tokens(llm) == eager


def test_siblings_on_the_same_weights_share_the_compiled_step(tiny_llama_dir, dynamo_eager):
    llm = LLM_(tiny_llama_dir, num_kv_blocks=64, compile="on")
    sibling = llm.engine.runner.with_config(llm.engine.config)
    assert sibling.decode is llm.engine.runner.decode
    assert sibling.model is llm.engine.runner.model


def test_an_8_bit_kv_cache_runs_eager(tiny_llama_dir, dynamo_eager):
    """The compiled step stores and reads the cache's values with no scales, so an 8-bit
    cache is left to the eager path, and says so."""
    options = dict(dtype="float32", num_kv_blocks=64, kv_cache_dtype="int8")
    llm = LLM_(tiny_llama_dir, compile="on", **options)
    assert llm.engine.runner.decode is None
    assert "kv_cache_dtype auto" in llm.engine.runner.describe()["compile"]
    assert tokens(llm) == tokens(LLM_(tiny_llama_dir, **options))


def test_the_graph_checks_only_its_inputs_guards(tiny_llama_dir, dynamo_eager, monkeypatch):
    # Dynamo offers a guard for every module attribute and weight of the model (thousands
    # on the default model, a millisecond a call); the graph keeps those on its inputs
    # (which graph: the batch-1 or the dynamic one) and on global state.
    offered, kept, choose = [], [], compiled.inputs_guards_only

    def recording(guards):
        flags = choose(guards)
        offered.extend(g.name for g in guards)
        kept.extend(g.name for g, keep in zip(guards, flags, strict=True) if keep)
        return flags

    monkeypatch.setattr(compiled, "inputs_guards_only", recording)
    tokens(LLM_(tiny_llama_dir, num_kv_blocks=64, compile="on"))
    inputs = {"ids", "positions", "slots", "visible", "last", "kv_cache", ""}  # "": global state
    assert set(kept) == inputs
    on_the_model = [n for n in offered if n == "model" or n.startswith(("model.", "model["))]
    assert len(on_the_model) > 100  # every attribute of every module, every weight


@pytest.mark.slow  # Inductor builds graphs: over 5 s on an idle 2-core machine
def test_two_models_in_one_process_each_run_their_own_graphs(tmp_path, dynamo_eager):
    # The same architecture and shapes, other weights: with no guard on the model, only the
    # code object each CompiledDecode compiles keeps one model's graphs from the other's.
    paths = [str(make_tiny_model_dir("llama", tmp_path / str(s), seed=s)) for s in (3, 4)]
    # fp32: the graph's attention sums in another order than eager's SDPA, and a random
    # tiny model in bf16 has near ties that an ulp turns (the default model's oracle runs bf16).
    options = dict(num_kv_blocks=64, dtype="float32")
    eager = [tokens(LLM_(p, **options)) for p in paths]
    assert eager[0] != eager[1]
    llms = [LLM_(p, compile="on", **options) for p in paths]
    assert [tokens(llm) for llm in llms] == eager
    assert [tokens(llm) for llm in reversed(llms)] == eager[::-1]


def described(weight: torch.Tensor) -> str:
    """What an Inductor-compiled step on weights like ``weight`` says of itself here."""
    if compiled.gemm_backend(weight) == "CPP":
        return "compiled decode steps (products: Inductor's AMX GEMM template)"
    return "compiled decode steps"


@pytest.mark.parametrize(
    ("dtype", "flags", "expected"),
    [
        (torch.bfloat16, {"amx_bf16": True, "avx512_bf16": True}, "CPP"),
        (torch.bfloat16, {"amx_bf16": False, "avx512_bf16": True}, "ATEN"),  # no AMX tiles
        (torch.bfloat16, {}, "ATEN"),
        (torch.float32, {"amx_bf16": True}, "ATEN"),  # MKL's fp32 products are faster
    ],
)
def test_the_gemm_template_is_chosen_for_bf16_on_amx_only(dtype, flags, expected):
    weight = torch.zeros(4, 4, dtype=dtype)
    assert compiled.gemm_backend(weight, flags) == expected


def eager_and_compiled_products(llm: LLM, rows: int):
    """Every linear layer's output on the same random rows: eager, and through the compiled
    step's ``products_alone``."""
    model = llm.engine.runner.model
    inputs = roofline.product_inputs(model, rows)
    compiled_products = llm.engine.runner.decode.products_alone(roofline.linear_layers(model))
    with torch.inference_mode():
        return roofline.eager_products(model)(inputs), compiled_products(inputs)


def test_the_products_alone_are_the_models_linear_layers_built_as_the_step(
    tiny_llama_dir, dynamo_eager
):
    torch._dynamo.reset()
    llm = LLM_(tiny_llama_dir, num_kv_blocks=64, compile="on")
    before = counters["stats"]["unique_graphs"]
    eager, compiled_out = eager_and_compiled_products(llm, rows=5)
    assert len(compiled_out) == 7 * llm.engine.runner.model.cfg.num_layers + 1  # and the head
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled_out, strict=True))
    # Built on one row and on eager's layout, as the step's two graphs; no third for 5 rows.
    assert counters["stats"]["unique_graphs"] - before == 2
    # The bench times these, not eager's, when the step is compiled: once per run, on B rows.
    model = llm.engine.runner.model
    products = llm.engine.runner.decode.products_alone(roofline.linear_layers(model))
    rows_seen: list[set[int]] = []

    def counted(inputs):
        rows_seen.append({x.shape[0] for x in inputs.values()})
        return products(inputs)

    roofline.time_linears(model, 3, repeats=2, products=counted)
    assert rows_seen == [{3}] * 3  # a warm-up and two timed runs


@pytest.mark.slow  # Inductor's C++ code generation: tens of seconds each
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bf16: packed layers, too
def test_inductor_tokens_equal_eager_on_a_tiny_model(dtype, tmp_path, monkeypatch):
    import torch._inductor.config as inductor_config

    path = str(make_tiny_model_dir("qwen3", tmp_path, seed=2))  # GQA, q/k norms
    eager = tokens(LLM_(path, num_kv_blocks=64, dtype=dtype, compile="off"))
    llm = LLM_(path, num_kv_blocks=64, dtype=dtype, compile="on")
    batches = counting_runs(monkeypatch)
    counters.clear()
    with inductor_config.patch(fx_graph_cache=False):  # generate the kernels: count them
        assert tokens(llm) == eager
    model = llm.engine.runner.model
    assert llm.engine.runner.describe()["compile"] == described(model.lm_head.weight)
    assert 4 in batches
    # bf16 on an AMX CPU: the products are the template's AMX micro-kernels; else ATen's.
    amx_kernels = counters["inductor"]["cpp_micro_gemm_amx_counter"]
    assert (amx_kernels > 0) == (compiled.gemm_backend(model.lm_head.weight) == "CPP")
    # The bench's products-alone probe goes through the same kernels: outputs as eager's
    # up to the dtype's rounding of another order of sums.
    with inductor_config.patch(fx_graph_cache=False):
        counters.clear()
        eager_out, compiled_out = eager_and_compiled_products(llm, rows=7)
    assert (counters["inductor"]["cpp_micro_gemm_amx_counter"] > 0) == (amx_kernels > 0)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for a, b in zip(eager_out, compiled_out, strict=True):
        torch.testing.assert_close(b, a, rtol=tol, atol=tol)


@pytest.mark.slow
@pytest.mark.perflab  # the default model, compiled by Inductor: two to seven minutes
def test_inductor_tokens_equal_eager_on_the_default_model(default_llm):
    texts = ("The capital of France is", "def f(", "Continuous batching lets a server")
    prompts = [default_llm.tokenizer.encode(t) for t in texts]
    eager = tokens(default_llm, prompts)
    engine = default_llm.engine
    try:  # the default model's weights, wrapped; the shared fixture keeps its eager engine
        runner = compiled.CompiledRunner(engine.runner)
        wrap(default_llm, runner)
        assert tokens(default_llm, prompts) == eager
        assert runner.decode.describe() == described(runner.model.lm_head.weight)
    finally:
        default_llm.engine = engine
