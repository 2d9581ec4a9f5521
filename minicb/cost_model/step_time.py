"""The step-time model of the simulated runner: how long one StepPlan takes on a named GPU.

A step is one forward pass over all the plan's rows (T tokens in all, S positions sampled:
one a sampling row, 1 + d a row verifying d speculative guesses).
Per GPU of a tensor-parallel group of ``tp``:

    weights  = streamed weight bytes / tp                       (read once per step)
               (the layers' matmul parameters x element size, or for 8-bit weights one
               byte each plus a scale in the compute dtype per output channel,
               minicb/quant/weights.py; the LM head always in the compute dtype)
    kv       = sum over rows of context_len x KV bytes per token / tp
               (KV bytes per token: 2 x layers x kv_heads x head_dim x element size, or for
               an 8-bit KV cache 2 x layers x kv_heads x (head_dim + 4): one byte a value
               and an fp32 scale per token and KV head, minicb/quant/kv.py)
    flops    = (2 x layer matmul params x T + 2 x vocab x hidden x S
                + 4 x layers x heads x head_dim x attended pairs) / tp
    t_memory  = (weights + kv) / (HBM bandwidth x bandwidth efficiency)
    t_compute = flops / (peak bf16 FLOP/s x FLOP efficiency)
    t_comm    = 2 x layers x (latency + 2 (tp - 1) / tp x T x hidden x element size
                              / (link bandwidth x link efficiency))      (0 when tp = 1)
    step      = max(t_memory, t_compute) + step overhead + t_comm  [+ chunk-step cost]
    bandwidth_util = (weights + kv) / HBM bandwidth / step        (of the published peaks,
    flop_util      = flops / peak bf16 FLOP/s / step               over the whole step: 0..1)

A row of n tokens whose context is c after the step attends n x c - n (n - 1) / 2 (query,
key) pairs (causal: its i-th token sees c - n + i + 1 keys). Memory and compute overlap on
a GPU (the roofline), the all-reduce does not (the next layer waits for it), and the step
overhead (scheduling, input preparation, sampling, launches) is paid once per step.

Two terms describe a CPU rather than a GPU, and keep their neutral defaults in every GPU
profile: ``overlap`` False adds t_memory and t_compute instead of taking their maximum (one
core streams and computes in turn: its decode time grows from batch 1 on), and
``chunk_step_s`` is paid by every step with a prompt chunk (the torch attention then makes
one masked SDPA call per chunk in every layer beside the decode rows' one; the calibrated
``cpu`` profile reads both off a probe, minicb/bench/calibration.py). docs/simulation.md
justifies every efficiency factor. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minicb.core.scheduler.plan import ScheduledRequest, StepPlan

GIB = 1 << 30
# kv_cache_dtype -> bytes per cached value; None: the compute dtype's (``elem_bytes``).
KV_VALUE_BYTES: dict[str, int | None] = {"auto": None, "int8": 1, "fp8": 1}
KV_SCALE_BYTES = 4  # an 8-bit cache's fp32 scale per token and KV head (minicb/quant/kv.py)
# weight_dtype -> bytes per decoder-layer matmul parameter; None: the compute dtype's. An
# 8-bit weight adds a scale in the compute dtype per output channel (minicb/quant/weights.py).
WEIGHT_VALUE_BYTES: dict[str, int | None] = {"auto": None, "int8": 1}
TERMS = ("memory_s", "compute_s", "comm_s", "overhead_s", "step_s", "bandwidth_util", "flop_util")


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: float  # device memory
    bandwidth: float  # HBM bytes/s, the published peak
    flops: float  # dense bf16 FLOP/s, the published peak
    interconnect: float = 0.0  # bytes/s one way per GPU (NVLink or PCIe); 0: none
    host_link: float = 0.0  # bytes/s one way to host memory (PCIe); 0: the host is its memory


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_model_len: int
    tie_word_embeddings: bool = False
    gated_mlp: bool = True  # gate, up and down projections (Llama); False: two (OPT)

    @property
    def layer_params(self) -> int:
        """Matmul parameters of one decoder layer (norms and biases are negligible)."""
        h, d = self.hidden_size, self.head_dim
        attention = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2  # q, o; k, v
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        return attention + mlp

    @property
    def layer_out_channels(self) -> int:
        """Output channels of one layer's matmuls: an 8-bit weight keeps a scale for each."""
        h, d = self.hidden_size, self.head_dim
        attention = self.num_heads * d + 2 * self.num_kv_heads * d + h  # q; k, v; o
        return attention + (2 if self.gated_mlp else 1) * self.intermediate_size + h

    def weight_bytes(self, elem: int, weight_dtype: str = "auto", streamed: bool = False) -> int:
        """Bytes of the weights: the layers' matmuls in ``elem`` bytes each ("auto") or
        8-bit with a scale of ``elem`` bytes per output channel ("int8"), the embedding
        table and (untied) the LM head in ``elem``. ``streamed``: only what a step reads
        whole (``streamed_params``: the layers and the LM head)."""
        value_bytes = WEIGHT_VALUE_BYTES[weight_dtype]
        if value_bytes is None:
            layer = self.layer_params * elem
        else:
            layer = self.layer_params * value_bytes + self.layer_out_channels * elem
        tables = 1 if streamed or self.tie_word_embeddings else 2
        return self.num_layers * layer + tables * self.vocab_size * self.hidden_size * elem

    @property
    def num_params(self) -> int:
        """All parameters: layers, the embedding table and (untied) the lm_head."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.layer_params + embeddings

    @property
    def streamed_params(self) -> int:
        """Parameters a step reads whole: the layers and the lm_head (the embedding table is
        only gathered, a row per token, unless it is the lm_head too)."""
        return self.num_layers * self.layer_params + self.vocab_size * self.hidden_size

    def kv_bytes_per_token(self, elem: int, kv_cache_dtype: str = "auto") -> int:
        """Bytes one token's keys and values take in every layer: ``elem`` per value in the
        compute dtype ("auto"), or one per value plus a scale per KV head (8-bit)."""
        value_bytes = KV_VALUE_BYTES[kv_cache_dtype]
        if value_bytes is None:
            per_head = self.head_dim * elem
        else:
            per_head = self.head_dim * value_bytes + KV_SCALE_BYTES
        return 2 * self.num_layers * self.num_kv_heads * per_head  # K and V

    def step_work(
        self,
        elem: int,
        tokens: int,
        sampling: int,
        context: float,
        pairs: float,
        kv_cache_dtype: str = "auto",
        weight_dtype: str = "auto",
    ) -> tuple[float, float]:
        """(bytes read, FLOPs) of a step over the whole model (the module docstring's
        ``weights + kv`` and ``flops`` before the division by tp): ``tokens`` tokens,
        ``sampling`` rows that sample, ``context`` context tokens over its rows and
        ``pairs`` attended (query, key) pairs (``step_totals``). An 8-bit KV cache reads
        fewer bytes per context token, 8-bit weights fewer per step; their dequantisation
        (a multiply per value, inside the kernels) is not counted, as it hides under the
        memory time."""
        kv = self.kv_bytes_per_token(elem, kv_cache_dtype)
        nbytes = self.weight_bytes(elem, weight_dtype, streamed=True) + context * kv
        flops = (
            2 * self.num_layers * self.layer_params * tokens
            + 2 * self.vocab_size * self.hidden_size * sampling
            + 4 * self.num_layers * self.num_heads * self.head_dim * pairs
        )
        return nbytes, flops


@dataclass(frozen=True)
class Efficiency:
    """Shares of the published peaks a serving engine reaches, and its fixed costs. The
    values are the catalogue's (``efficiency``), justified in docs/simulation.md."""

    bandwidth: float
    flops: float
    interconnect: float
    step_overhead_s: float
    allreduce_latency_s: float
    overlap: bool = True  # memory and compute overlap (a GPU); False: they add up (a CPU core)
    chunk_step_s: float = 0.0  # paid by a step with a prompt chunk (``has_chunk``)


def attended_pairs(num_tokens: int, context_len: int) -> int:
    """(query, key) pairs of a causal chunk of ``num_tokens`` ending at ``context_len``."""
    return num_tokens * context_len - num_tokens * (num_tokens - 1) // 2


@dataclass(frozen=True)
class StepTimeModel:
    """Predicted seconds of a step of a model shape on ``tp`` GPUs of one kind."""

    gpu: GPUSpec
    model: ModelShape
    efficiency: Efficiency
    elem_bytes: int = 2  # bf16
    tp: int = 1
    kv_cache_dtype: str = "auto"  # "auto": the KV cache in elem_bytes; "int8"/"fp8": 8-bit
    weight_dtype: str = "auto"  # "auto": the layers' weights in elem_bytes; "int8": 8-bit

    @property
    def name(self) -> str:
        tp = f" x{self.tp}" if self.tp > 1 else ""
        return f"{self.gpu.name}{tp}:{self.model.name}"

    # ---- memory ----------------------------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        """Bytes of all the weights, over the whole tensor-parallel group."""
        return self.model.weight_bytes(self.elem_bytes, self.weight_dtype)

    @property
    def kv_token_bytes(self) -> int:
        """Bytes of one token's KV in every layer, in this profile's KV cache dtype."""
        return self.model.kv_bytes_per_token(self.elem_bytes, self.kv_cache_dtype)

    def block_bytes(self, block_size: int) -> int:
        return block_size * self.kv_token_bytes

    def num_kv_blocks(self, block_size: int, utilisation: float = 0.9) -> int:
        """The pool as a serving engine sizes it: memory x utilisation minus the weights,
        divided by the bytes of a block (each GPU holds 1/tp of both)."""
        free = self.tp * self.gpu.memory_bytes * utilisation - self.weight_bytes
        blocks = int(free // self.block_bytes(block_size))
        if blocks < 1:
            raise ValueError(
                f"{self.name}: the weights ({self.weight_bytes / GIB:.1f} GiB) leave no room "
                f"for a KV block in {utilisation:.0%} of {self.tp} x "
                f"{self.gpu.memory_bytes / GIB:.0f} GiB; use a larger GPU or more of them"
            )
        return blocks

    # ---- time ------------------------------------------------------------------------------
    def terms(self, rows: Iterable[tuple[int, int, int]]) -> dict[str, float]:
        """Each term of the step time for rows of (num_tokens, context_len, positions
        sampled: a bool counts as 0 or 1)."""
        rows = list(rows)
        return self.totals_terms(*step_totals(rows), chunk=has_chunk(r[0] for r in rows))

    def totals_terms(
        self, tokens: int, sampling: int, context: int, pairs: int, chunk: bool = False
    ) -> dict[str, float]:
        """Each term of the step time of a step of ``tokens`` tokens, ``sampling`` rows that
        sample, ``context`` context tokens over its rows and ``pairs`` attended pairs;
        ``chunk``: it has a row of more than one token (``has_chunk``)."""
        m, e, tp = self.model, self.efficiency, self.tp
        if tokens == 0:
            return dict.fromkeys(TERMS, 0.0)
        work = (tokens, sampling, context, pairs, self.kv_cache_dtype, self.weight_dtype)
        nbytes, flops = m.step_work(self.elem_bytes, *work)
        memory = nbytes / tp / (self.gpu.bandwidth * e.bandwidth)
        compute = flops / tp / (self.gpu.flops * e.flops)
        comm = 0.0
        if tp > 1:  # two all-reduces per layer (after attention, after the MLP), ring
            moved = 2 * (tp - 1) / tp * tokens * m.hidden_size * self.elem_bytes
            link = self.gpu.interconnect * e.interconnect
            comm = 2 * m.num_layers * (e.allreduce_latency_s + moved / link)
        roofline = max(memory, compute) if e.overlap else memory + compute
        overhead = e.step_overhead_s + (e.chunk_step_s if chunk else 0.0)
        step = roofline + overhead + comm
        # how busy the hardware is: the peak's time for the work over the step's time
        busy = (nbytes / tp / self.gpu.bandwidth / step, flops / tp / self.gpu.flops / step)
        # the terms in ``TERMS``'s order, the one place their names are written
        return dict(zip(TERMS, (memory, compute, comm, overhead, step, *busy), strict=True))

    def plan_terms(self, plan: StepPlan) -> dict[str, float]:
        return self.terms(plan_rows(plan.scheduled))

    def __call__(self, plan: StepPlan) -> float:
        """Seconds the plan's step takes (FakeRunner's ``step_time_fn``)."""
        return self.plan_terms(plan)["step_s"]

    def describe(self) -> dict[str, Any]:
        return {
            "profile": self.name,
            "gpu": self.gpu.name,
            "model": self.model.name,
            "tensor_parallel_size": self.tp,
            "kv_cache_dtype": self.kv_cache_dtype,
            "weight_dtype": self.weight_dtype,
            "weight_gib": round(self.weight_bytes / GIB, 2),
        }


def plan_rows(scheduled: list[ScheduledRequest]) -> Iterable[tuple[int, int, int]]:
    """A plan's rows as the step-time model reads them: (num_tokens, context_len, positions
    sampled). A row that samples does so at its last position, and a row verifying ``d``
    speculative guesses at all ``1 + d`` of them: the LM head runs at each."""
    return (
        (r.num_tokens, r.context_len, r.samples * (1 + r.num_draft_tokens)) for r in scheduled
    )


def has_chunk(num_tokens: Iterable[int]) -> bool:
    """Whether a step of rows of these token counts has a row of more than one token (a
    prompt chunk): the torch attention then makes a masked SDPA call per chunk in every layer
    (minicb/core/attention/torch_attention.py), beyond the decode-only path
    (``AttentionMetadata.is_decode_only``)."""
    return any(n > 1 for n in num_tokens)


def step_totals(rows: Iterable[tuple[int, int, int]]) -> tuple[int, int, int, int]:
    """(tokens, positions sampled, context tokens, attended pairs) of rows of (num_tokens,
    context_len, positions sampled): all the step-time model needs to know of a step."""
    tokens = sampling = context = pairs = 0
    for n, c, samples in rows:
        tokens, sampling, context = tokens + n, sampling + samples, context + c
        pairs += attended_pairs(n, c)
    return tokens, sampling, context, pairs
