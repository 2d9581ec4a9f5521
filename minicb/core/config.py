"""The two kinds of settings: EngineConfig for the engine, SamplingParams per request.

EngineConfig is one frozen dataclass, validated once, built at start-up and passed
explicitly to the scheduler, block manager and runner; nothing reads settings from globals
or the environment after this point. SamplingParams says how one request wants its tokens
chosen and when it stops. Pure Python (no torch), so the scheduler and the server can
validate requests without touching the model. Their command-line flags are in
minicb/engine_options.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

BATCHING_MODES = ("continuous", "static")
POLICIES = ("fcfs", "priority")
STATIC_ORDERS = ("arrival", "length")
PREEMPTION_MODES = ("recompute", "swap")
KV_RESERVATIONS = ("paged", "max", "pow2", "oracle")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
DTYPES = ("auto", "float32", "bfloat16", "float16")
SPECULATIVE_MODES = ("off", "ngram", "draft", "early_exit")
KV_CACHE_DTYPES = ("auto", "int8", "fp8")
WEIGHT_DTYPES = ("auto", "int8")


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling limits and engine choices. See README for what each one teaches."""

    batching: str = "continuous"
    policy: str = "fcfs"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: size the pool from free memory
    num_swap_blocks: int | None = None  # None: as many as num_kv_blocks
    enable_chunked_prefill: bool = True
    # Share the KV blocks of common prompt prefixes (continuous batching only: the static
    # baseline stands for a padded generate, which has no prefix cache).
    enable_prefix_caching: bool = True
    # A second tier for the prefix cache (minicb/host_tier/tier.py): cached blocks the
    # device pool evicts are copied to this many host blocks, found by the same keys and
    # copied back on a later hit. 0: off (an evicted prefix is forgotten).
    kv_offload_blocks: int = 0
    preemption_mode: str = "recompute"
    # KV cache given at admission (continuous batching; see minicb/reservation/modes.py):
    # "paged" (nothing ahead, blocks as tokens come), or prompt + "max" (max_tokens),
    # "pow2" (the expected output rounded up to a power of two), "oracle" (exactly it).
    kv_reservation: str = "paged"
    # How the static baseline picks a new batch from the queue: "arrival" (the policy's
    # order) or "length" (similar max_tokens together, so less padding).
    static_order: str = "arrival"
    # Priority aging: a waiting request's effective priority improves by one level
    # every `aging_steps` iterations, so nobody waits forever.
    aging_steps: int = 16
    attention_backend: str = "auto"
    dtype: str = "auto"
    # How keys and values are stored (minicb/quant/kv.py): "auto" in the compute dtype;
    # "int8" or "fp8" (float8_e4m3fn) in one byte each with a scale per token and KV head,
    # so the same memory holds about twice the blocks (and the batch can grow).
    kv_cache_dtype: str = "auto"
    # How the decoder's linear weights are held (minicb/quant/weights.py): "auto" in the
    # compute dtype; "int8" weight-only, a scale per output channel (a quarter of fp32's
    # bytes). Activations and arithmetic stay in the compute dtype; LM head untouched.
    weight_dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None  # None: the model's own context length
    # The share of free memory the KV pool may take when sized automatically.
    kv_memory_fraction: float = 0.5
    use_cuda_graphs: bool = True
    # bfloat16 on CPU: linear layers read weights packed once for oneDNN
    # (minicb.packing.packed); False keeps plain nn.Linear, the reference.
    packed_weights: bool = True
    # Ranks the model is split over (Megatron-style tensor parallelism): rank 0 runs the
    # engine, ranks 1..N-1 run their shard of every layer (minicb/parallel/tp_group.py).
    tensor_parallel_size: int = 1
    seed: int = 0
    # Speculative decoding (minicb/speculation/): "ngram" lets a decode row (at any
    # temperature: the draws keep the model's distribution, docs/speculative.md) propose up
    # to num_speculative_tokens tokens that followed an earlier occurrence of its last
    # ngram_min..ngram_max tokens, verified in the same forward pass as everyone else.
    speculative: str = "off"
    num_speculative_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 4
    # "draft": a draft model (a model folder with the target's tokenizer, or the default
    # model's name) proposes the tokens; "early_exit": the target's first draft_layers
    # layers and its LM head do (self-speculation).
    draft_model: str | None = None
    draft_layers: int | None = None
    # The real model runner reports each step's bandwidth and FLOP utilisation against this
    # machine's measured copy bandwidth and matmul FLOP/s (minicb/utilisation/occupancy.py); the
    # probes take a few seconds, once per process. On in the demo and serve, off elsewhere.
    measure_utilisation: bool = False
    # Overlap scheduling (minicb/overlap/): plan iteration N+1 while the runner executes N,
    # with N's tokens as placeholders; finishes are learnt one iteration late and the extra
    # row is discarded. With speculative decoding, a plan that verifies drafts is waited for
    # before the next is planned (its accepted count places the next rows).
    overlap_scheduling: bool = False
    # Batch-invariant arithmetic (minicb/kernels/batch_invariant.py): linears in fixed row
    # tiles and attention for each token alone in fixed key tiles, so a token's numbers never
    # depend on its batch. Slower; what makes an 8-bit KV cache's greedy tokens equal across
    # batch sizes, chunk sizes and preemption. Torch attention, one process.
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        self._check_choice("batching", BATCHING_MODES)
        self._check_choice("policy", POLICIES)
        self._check_choice("preemption_mode", PREEMPTION_MODES)
        self._check_choice("kv_reservation", KV_RESERVATIONS)
        self._check_choice("static_order", STATIC_ORDERS)
        self._check_choice("attention_backend", ATTENTION_BACKENDS)
        self._check_choice("dtype", DTYPES)
        self._check_choice("kv_cache_dtype", KV_CACHE_DTYPES)
        self._check_choice("weight_dtype", WEIGHT_DTYPES)
        self._check_choice("speculative", SPECULATIVE_MODES)
        self._check_positive("max_num_seqs")
        self._check_positive("max_num_batched_tokens")
        self._check_positive("block_size")
        self._check_positive("aging_steps")
        self._check_positive("num_speculative_tokens")
        self._check_positive("ngram_min")
        self._check_positive("ngram_max")
        if self.draft_layers is not None:
            self._check_positive("draft_layers")
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})"
            )
        self._check_positive("tensor_parallel_size")
        if self.weight_dtype != "auto" and self.tensor_parallel_size > 1:
            raise ValueError("weight_dtype int8 is not built for tensor_parallel_size > 1")
        if self.batch_invariant and self.attention_backend == "triton":
            raise ValueError(
                "batch_invariant attention is built on torch: use attention_backend torch or "
                "auto (it takes torch then), not triton"
            )
        if self.batch_invariant and self.tensor_parallel_size > 1:
            raise ValueError("batch_invariant is not built for tensor_parallel_size > 1")
        if not isinstance(self.measure_utilisation, bool):
            raise ValueError(
                f"measure_utilisation must be True or False, got {self.measure_utilisation!r}"
            )
        if self.num_kv_blocks is not None:
            self._check_positive("num_kv_blocks")
        if self.num_swap_blocks is not None and self.num_swap_blocks < 0:
            raise ValueError(f"num_swap_blocks must be >= 0, got {self.num_swap_blocks}")
        offload = self.kv_offload_blocks
        if not isinstance(offload, int) or isinstance(offload, bool) or offload < 0:
            raise ValueError(f"kv_offload_blocks must be >= 0, got {self.kv_offload_blocks!r}")
        if self.kv_offload_blocks and not self.enable_prefix_caching:
            raise ValueError(
                "kv_offload_blocks is a second tier of the prefix cache: it needs "
                "enable_prefix_caching on"
            )
        if self.max_model_len is not None:
            self._check_positive("max_model_len")
        if not 0.0 < self.kv_memory_fraction <= 1.0:
            raise ValueError(f"kv_memory_fraction must be in (0, 1], got {self.kv_memory_fraction}")

    def _check_choice(self, name: str, allowed: tuple[str, ...]) -> None:
        value = getattr(self, name)
        if value not in allowed:
            raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")

    def _check_positive(self, name: str) -> None:
        value = getattr(self, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from keyword arguments, naming any that EngineConfig does not know."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s): {', '.join(unknown)}")
        return cls(**kwargs)

    def with_(self, **changes: Any) -> EngineConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# A temperature below this is greedy (as in vLLM's sampler). Dividing fp32 logits by a
# smaller one makes them overflow to inf (and 1e-46 rounds to 0 in float32: every logit
# becomes inf or NaN), so a draw at such a temperature would pick garbage instead of
# the argmax it tends to; at 1e-5 the argmax already holds all the mass.
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_SALT = 256  # characters of a cache_salt


@dataclass
class SamplingParams:
    """Per-request decoding settings.

    temperature 0 (or anything under ``GREEDY_BELOW_TEMPERATURE``) means greedy. ``seed``
    makes sampling reproducible for this request whatever else shares its batch: each
    token draws from a generator seeded by (seed, token index), never from a shared stream.
    ``cache_salt`` scopes the prefix cache: a request finds cached blocks only from
    requests with the same salt (None: the shared, unsalted cache; prefix_cache.py).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filtering
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the limit that a field breaks."""
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool):
            raise ValueError(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= float(self.temperature) <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or positive, got {self.top_k}")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        salt = self.cache_salt
        if salt is not None and not (isinstance(salt, str) and 0 < len(salt) <= MAX_SALT):
            raise ValueError(
                f"cache_salt must be None or a string of 1 to {MAX_SALT} characters"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE
