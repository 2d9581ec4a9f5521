"""The compiled decode step: the whole forward of a decode-only step as one Inductor graph.

A lab runner, not the engine's: ``CompiledRunner`` wraps a ``ModelRunner`` through the
runner seam (``LLMEngine(runner=...)``) and hands the model runner's ``execute`` its own
logits for decode-only steps; everything else (swaps, prompt chunks, sampling, timing,
utilisation) is the model runner's one eager path. ``compiled_engine`` builds one.

Besides its matmuls, a decode step of eager PyTorch runs some 1,500 small ops (RMSNorm,
rope, SiLU, residual adds, the attention's gathers), each a trip through the dispatcher and
a separate pass over memory: at batch 1 on the 2-core AMX machine, 12 of a step's 40 ms.
``torch.compile`` of the model's own forward, embedding to final norm, with Inductor's
*freezing* turns that into a few fused C++ loops between the products: freezing treats the
weights as constants and lays each one out once for the kernel that multiplies by it. The
graph runs from the token ids to the logits (the LM head, a fifth of the weights of the
default model, inside it). Steps with a prompt chunk stay eager (the chunks' attention loops
over requests; a decode-only step is the steady state).

Which kernel multiplies (``gemm_backend``): in bfloat16 on a CPU with AMX, Inductor's own
C++ GEMM template, an AMX micro-kernel generated for each product's shape with the weight
packed into its tiles; elsewhere ATen's (oneDNN, MKL). The template streams the weights
faster than oneDNN at every decode batch measured: the default model's 211 products, bf16,
one thread, 26 against 36 ms at 2 rows, 28 against 40 at 16, 34 against 50 at 32
(docs/performance.md, "Forward pass"). In float32 it was slower than MKL at 32 rows (217
against 122 ms), so float32 keeps ATen's. The price is the build: about twice as long.

What makes it one graph, and rounds as eager:

- **The cache is only read inside it.** An in-graph write into the paged cache became a copy
  of the whole cache in every layer. The graph's attention backend (``ReadOnlyCache``) keeps
  each layer's new key and value, puts them into the gathered context at the last position
  (where eager reads them back after storing), and the graph returns them; one write after
  the graph stores all layers' (``store_all_layers``).
- **No fused post-ops.** Inductor fuses a residual add or a SiLU into the oneDNN product
  before it, one bf16 rounding fewer than eager; while the graph is traced and called,
  ``llama.residual_add`` and ``llama.silu`` are this module's fp32 forms rounded once, which
  round as eager does, and a packed layer hands the graph its plain weight (freezing lays it
  out for oneDNN itself): ``graph_forms``.
- **The layout of eager's products.** Freezing lays a weight out for the batch size of the
  call that builds the graph, and the layout decides the order of the sums: the graphs are
  built before the first step, on one row and on ``PACKED_FOR_ROWS`` (eager's layout).

What keeps the host's share small: Inductor's C++ wrapper calls the kernels (no Python
between them), Dynamo checks only the inputs' guards (``inputs_guards_only``), and the
one-row graph's attention is fused sums over the cache, not an SDPA call per layer.

What stays different: Inductor's fused reductions (RMSNorm's sum) add in another order than
ATen's, which now and then moves a value across a bf16 rounding boundary (one row in 32 of
a decode step, on repetitive prompts with near ties). Greedy tokens then can differ from
eager's in bf16; on the oracle's prompts they are equal (tests/perflab/test_compiled_forward.py).
Forcing ATen's reduction (an opaque operator for the sum) made the first step bitwise equal
but cost most of the speed, and later steps still differed.

Two graphs in all, whatever the batch sizes and context lengths (the shapes are dynamic;
Dynamo specialises a batch of one). Building them for the default model on two cores takes
about two minutes with ATen's products and six to seven with the GEMM template, whose C++ is
larger, so the engine does not compile (``minicb bench --compile on`` wraps its runners
here where this folder sits beside the package). Where compilation fails, the runner says so in one
logged line and runs eager for good; the graph is pure, so a failed call leaves nothing half
written.
docs/performance.md ("Forward pass") has the figures.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from minicb.core.attention.kv_slots import storing
from minicb.core.attention.torch_attention import DecodeIndex, attend_contexts, gather_contexts
from minicb.core.config import EngineConfig
from minicb.core.engine import LLMEngine
from minicb.core.runner import RunnerOutput, llama
from minicb.core.runner.dtype import cpu_capabilities
from minicb.core.runner.model_runner import ModelRunner, build_runner
from minicb.core.runner.step_inputs import StepInputs
from minicb.core.scheduler.plan import StepPlan
from minicb.packing.packed import PACKED_FOR_ROWS, PackedLinear
from minicb.parallel.settings import ParallelSettings
from minicb.quant.settings import QuantSettings

log = logging.getLogger(__name__)


def residual_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y as an fp32 add rounded once to the dtype, which is what eager computes: written
    plainly, Inductor fuses the add into the oneDNN product before it (a post-op on its fp32
    accumulator), one bf16 rounding fewer than eager and transformers, and the greedy tokens
    change."""
    return (x.float() + y.float()).to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU as ``x * sigmoid(x)`` in fp32, rounded once, for the reason of ``residual_add``:
    Inductor fuses ``F.silu`` into the product before it."""
    xf = x.float()
    return (xf * torch.sigmoid(xf)).to(x.dtype)


def plain_linear(self: PackedLinear, x: torch.Tensor) -> torch.Tensor:
    """A packed layer inside the graph: the plain weight, which Inductor's freezing lays out
    for oneDNN itself and multiplies from its generated code."""
    return nn.functional.linear(x, self.weight, self.bias)


@contextlib.contextmanager
def graph_forms() -> Iterator[None]:
    """The model's residual add, SiLU and packed products in the forms above while a graph
    is traced or called (Dynamo reads the module's globals as it traces; the guards on
    them are skipped, ``inputs_guards_only``, so the eager forms come back after it)."""
    saved = llama.residual_add, llama.silu, PackedLinear.forward
    llama.residual_add, llama.silu, PackedLinear.forward = residual_add, silu, plain_linear
    try:
        yield
    finally:
        llama.residual_add, llama.silu, PackedLinear.forward = saved


@dataclass(frozen=True)
class GraphStep:
    """The step metadata the layers read inside the graph: no slots, the store is after it."""

    slot_mapping: None = None


class ReadOnlyCache:
    """The attention backend inside the graph: reads the paged cache, never writes it."""

    name = "read-only"
    reason = "inside the compiled decode graph"

    def __init__(self, index: DecodeIndex, last: torch.Tensor) -> None:
        self.index = index
        self.last = last  # (B,) each row's own position in its gathered context
        self.new_kv: list[torch.Tensor] = []  # per layer (2, B, kv_heads, head_dim)

    def store_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        self.new_kv.append(torch.stack([key.to(k_cache.dtype), value.to(v_cache.dtype)]))

    def contexts(self, k_cache, v_cache) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's keys and values (B, L, kv_heads, D) gathered from the cache, with this
        step's own, not yet stored, at their position ``last``: what eager reads back."""
        key, value = self.new_kv[-1]  # (B, kv_heads, D)
        length = self.index.length
        own = torch.arange(length, device=key.device)[None, :] == self.last[:, None]
        own = own[:, :, None, None]  # (B, L, 1, 1)
        k = torch.where(own, key[:, None], gather_contexts(k_cache, self.index))
        v = torch.where(own, value[:, None], gather_contexts(v_cache, self.index))
        return k, v

    def attention(self, query, k_cache, v_cache, meta, scale) -> torch.Tensor:
        k, v = self.contexts(k_cache, v_cache)
        if self.index.batch == 1:  # the one-row graph (Dynamo specialises a size of 1)
            return self.one_row_attention(query, k, v, scale)
        return attend_contexts(query, k, v, self.index, scale)

    def one_row_attention(self, query, k, v, scale) -> torch.Tensor:
        """One query's softmax attention over its context, written out as products and
        sums rather than as SDPA: Inductor fuses the gather from the cache into the loops
        that read it and calls no kernel (torch's fused SDPA costs some 60 us a call, 1.8 ms
        a step at batch 1). It rounds where that kernel rounds: fp32 scores and sums, the
        softmax's numerators in the cache's dtype before they weigh the values. At 32 rows
        Inductor's loops were slower than SDPA (a step 1.16x as long), hence one row only."""
        (batch, heads, dim), (length, kv_heads) = query.shape, k.shape[1:3]
        # Each KV head's group of query heads: (1, 1, kv_heads, group, D).
        q = query.float().view(batch, 1, kv_heads, heads // kv_heads, dim)
        scores = (q * k.float()[:, :, :, None]).sum(-1) * scale  # (1, L, kv_heads, group)
        visible = self.index.visible.view(batch, length, 1, 1)
        scores = scores.masked_fill(~visible, float("-inf"))
        numerators = torch.exp(scores - scores.amax(dim=1, keepdim=True))
        weights = numerators.to(v.dtype).float()[..., None]  # (1, L, kv_heads, group, 1)
        out = (weights * v.float()[:, :, :, None]).sum(1) / numerators.sum(1)[..., None]
        return out.reshape(batch, heads, dim).to(query.dtype)


def store_all_layers(kv_cache: torch.Tensor, new_kv: torch.Tensor, slots: torch.Tensor) -> None:
    """Write every layer's new keys and values (layers, 2, B, kv_heads, head_dim) to their
    slots of ``kv_cache`` (layers, 2, blocks, block_size, kv_heads, head_dim); rows whose
    slot is -1 (static padding) store nothing."""
    keep = storing(slots)
    if keep is not None:
        slots, new_kv = slots[keep], new_kv[:, :, keep]
    kv_cache.flatten(2, 3)[:, :, slots] = new_kv


def inputs_guards_only(guards: list) -> list[bool]:
    """Which of Dynamo's guards a call checks: those on the inputs (dtype, device, shape:
    which of the two graphs) and on global state, not the 4,000 on the model's modules and
    weights nor those on module globals (1.1 ms a call, against 0.15). Safe here: the
    code object is compiled for one model (``CompiledDecode``), whose modules are never
    changed, and whose weights freezing has made constants of the graph."""
    modules = torch.compiler.skip_guard_on_all_nn_modules_unsafe(guards)
    global_names = torch.compiler.skip_guard_on_globals_unsafe(guards)
    return [a and b for a, b in zip(modules, global_names, strict=True)]


def gemm_backend(weight: torch.Tensor, capabilities=None) -> str:
    """The kernels Inductor calls for the graph's products: "CPP", its own GEMM template,
    for bfloat16 weights on a CPU with AMX-BF16; "ATEN" (oneDNN, MKL, cuBLAS) otherwise.
    ``capabilities``: the CPU's flags (a test passes its own)."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return "ATEN"
    caps = cpu_capabilities() if capabilities is None else capabilities
    return "CPP" if caps.get("amx_bf16") else "ATEN"


def own_code(fn: Callable) -> Callable:
    """``fn`` with a code object of its own. Dynamo keeps its graphs on the code object, and
    with freezing each graph holds a copy of a model's weights. Shared, every engine built in
    a process would add graphs to one cache (up to Dynamo's recompile limit), none would be
    freed with it, a graph built with other Inductor settings would be found for the same
    inputs, and with no guard on the model (``inputs_guards_only``) one model's graph would
    run another's steps."""
    code = fn.__code__.replace()
    return types.FunctionType(code, fn.__globals__, fn.__name__, None, fn.__closure__)


class CompiledDecode:
    """The decode-step graph of one model, built at its first step, eager as the fallback."""

    def __init__(self, model: torch.nn.Module, backend: str = "inductor") -> None:
        """``backend``: torch.compile's; tests pass "eager" (Dynamo's graph, no codegen)."""
        self.backend = backend
        self.gemm = gemm_backend(model.lm_head.weight)
        self.error: str | None = None  # why it fell back to eager, once it has
        self._built = False

        def decode_forward(ids, positions, slots, visible, last, kv_cache):
            index = DecodeIndex(slots, visible, batch=visible.shape[0], length=visible.shape[-1])
            cache = ReadOnlyCache(index, last)
            layers = [(kv_cache[i, 0], kv_cache[i, 1]) for i in range(kv_cache.shape[0])]
            hidden = model(ids, positions, GraphStep(), layers, cache)
            return model.logits(hidden), torch.stack(cache.new_kv)

        try:
            guards = {"guard_filter_fn": inputs_guards_only}
            options = dict(backend=backend, dynamic=True, fullgraph=True, options=guards)
            if backend == "inductor":
                guards["emulate_precision_casts"] = True  # round as eager
            self._graph = torch.compile(own_code(decode_forward), **options)
        except Exception as err:  # torch.compile unavailable on this platform or build
            self._fall_back(err)

    def _fall_back(self, err: Exception) -> None:
        self.error = f"{type(err).__name__}: {err}".splitlines()[0]
        log.warning("torch.compile failed, running the model eager: %s", self.error)

    @contextlib.contextmanager
    def _inductor_options(self) -> Iterator[None]:
        """Inductor's settings for building and calling this model's graphs."""
        if self.backend != "inductor":
            yield
            return
        import torch._inductor.config as inductor_config

        # The config patch, not torch.compile's options, is what switches freezing on. The
        # C++ wrapper calls the graph's kernels from C++, not from Python: 4 ms a step less
        # at batch 1 on the default model. The GEMM template is reached through "max
        # autotune" with it as the only backend: one choice per product, nothing timed, so
        # every build gives the same kernels (and the same sums).
        gemm = {}
        if self.gemm == "CPP":
            gemm = dict(max_autotune=True, max_autotune_gemm_backends="CPP")
        with inductor_config.patch(freezing=True, cpp_wrapper=True, **gemm):
            yield

    def _call(self, ids, positions, slots, visible, last, kv_cache):
        with self._inductor_options(), graph_forms():
            return self._graph(ids, positions, slots, visible, last, kv_cache)

    def products_alone(
        self, linears: list[torch.nn.Module]
    ) -> Callable[[dict[int, torch.Tensor]], list[torch.Tensor]] | None:
        """``linears`` (the model's linear layers, in forward order) back to back, compiled
        as the step is (freezing, the same GEMM kernels, built on one row and on eager's
        layout): the bound the products alone set, which the bench times beside the step
        (perflab.roofline.time_linears). The returned function takes one input per
        layer width, (rows, width), and returns each layer's output. None where the step
        runs eager."""
        if self.error is not None:
            return None
        widths = sorted({m.weight.shape[1] for m in linears})

        def products(*inputs):
            by_width = dict(zip(widths, inputs, strict=True))
            return [m(by_width[m.weight.shape[1]]) for m in linears]

        graph = torch.compile(
            own_code(products), backend=self.backend, dynamic=True, fullgraph=True
        )

        def run(inputs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
            with self._inductor_options(), graph_forms(), torch.inference_mode():
                return graph(*(inputs[w] for w in widths))

        weight = linears[0].weight
        for rows in (1, PACKED_FOR_ROWS):  # the two graphs the step has, built alike
            run({w: torch.zeros(rows, w, dtype=weight.dtype, device=weight.device) for w in widths})
        return run

    def _build(self, kv_cache: torch.Tensor) -> None:
        """Both graphs, on dummy steps that read slot 0: one row, and eager's layout."""
        for batch in (1, PACKED_FOR_ROWS):
            zeros = torch.zeros(batch, dtype=torch.long, device=kv_cache.device)
            # A context length that is a size of no other input: Dynamo gives equal sizes
            # one symbol, and a length equal to the cache's 2 (keys, values) would be
            # specialised to it, and rebuilt at the first real step.
            context = next(
                n for n in range(3, 1 << 16) if {n, n * batch}.isdisjoint(kv_cache.shape)
            )
            slots = torch.zeros(batch * context, dtype=torch.long, device=kv_cache.device)
            visible = torch.ones(batch, 1, 1, context, dtype=torch.bool, device=kv_cache.device)
            # Distinct tensors: Dynamo guards on which inputs are the same tensor.
            ids, positions, last = (zeros.clone() for _ in range(3))
            self._call(ids, positions, slots, visible, last, kv_cache)
        self._built = True

    def run(self, input_ids, positions, meta, kv_cache, block_size) -> torch.Tensor | None:
        """Every row's logits (B, vocab) of a decode-only step, its KV stored in
        ``kv_cache`` (the runner's whole pool); None where the graph cannot run (the runner
        then runs the step eager)."""
        if self.error is not None:
            return None
        try:
            if not self._built:
                self._build(kv_cache)
            index = DecodeIndex.build(meta, block_size)
            last = meta.context_lens.long() - 1
            logits, new_kv = self._call(
                input_ids, positions, index.slots, index.visible, last, kv_cache
            )
        except Exception as err:  # e.g. no working C++ compiler: nothing was written yet
            self._fall_back(err)
            return None
        store_all_layers(kv_cache, new_kv, meta.slot_mapping)
        return logits

    def describe(self) -> str:
        if self.error:
            return "eager: torch.compile failed: " + self.error
        if self.backend == "inductor" and self.gemm == "CPP":
            return "compiled decode steps (products: Inductor's AMX GEMM template)"
        return "compiled decode steps"


EAGER = "eager: the compiled decode step needs tensor_parallel_size 1 and kv_cache_dtype auto"


class CompiledRunner:
    """A runner: ``inner``'s steps, with its decode-only steps through the compiled graph.

    Everything but ``execute``, ``with_config`` and ``describe`` is the model runner's (its
    pools, tokenizer, dtype, device). Siblings built by ``with_config`` share the one
    ``CompiledDecode`` (and its graphs), as they share the weights. Under tensor parallelism
    the layers' all-reduces would sit inside the graph: every step runs eager, and
    ``describe`` says why."""

    def __init__(
        self, inner: ModelRunner, decode: CompiledDecode | None = None, backend: str | None = None
    ) -> None:
        """``decode``: a sibling's compiled step to share; ``backend``: torch.compile's
        (None: CompiledDecode's own default, Inductor)."""
        self.inner = inner
        self.decode: CompiledDecode | None = None
        # Eager under tensor parallelism, and with an 8-bit KV cache: the compiled step
        # stores and reads the cache's values as they are, with no scales.
        ranks = ParallelSettings.of(inner.config).tensor_parallel_size
        if ranks == 1 and QuantSettings.of(inner.config).kv_cache_dtype == "auto":
            options = {} if backend is None else {"backend": backend}
            self.decode = decode or CompiledDecode(inner.model, **options)

    def __getattr__(self, name: str) -> Any:  # the Runner protocol's fields and the rest
        if name == "inner":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def execute(self, plan: StepPlan) -> RunnerOutput:
        return self.inner.execute(plan, forward=self.logits)

    def logits(self, batch: StepInputs) -> torch.Tensor | None:
        """The sampling rows' logits: from the graph for a decode-only step, else (or where
        the graph cannot run) the model runner's eager ones. (A step a CUDA graph replays
        never comes here: the graph's wrapper, inside this one, takes it first.)"""
        meta, inner = batch.meta, self.inner
        if self.decode is None or not meta.is_decode_only:
            return inner.logits(batch)
        # The graph ends with the LM head: every row's logits (a static batch's padding rows
        # too, which sample nothing); None if it could not run.
        logits = self.decode.run(
            batch.input_ids, batch.positions, meta, inner.kv_cache, inner.config.block_size
        )
        if logits is None:
            return inner.logits(batch)
        rows = batch.sample_rows
        if len(rows) == len(logits):
            return logits  # every row samples: no copy
        return logits[rows] if rows else None

    def with_config(self, config: EngineConfig) -> CompiledRunner:
        return CompiledRunner(self.inner.with_config(config), self.decode)

    def describe(self) -> dict[str, Any]:
        compiled = self.decode.describe() if self.decode is not None else EAGER
        return self.inner.describe() | {"compile": compiled}


def compiled_engine(
    model: str | None, config: EngineConfig, backend: str | None = None, **kwargs: Any
) -> LLMEngine:
    """An engine on ``model`` whose decode-only steps run the compiled graph (``kwargs``:
    LLMEngine's, such as ``clock`` or ``bus``)."""
    runner = CompiledRunner(build_runner(model, config), backend=backend)
    return LLMEngine(config=config, runner=runner, **kwargs)
