"""The two kinds of settings: EngineConfig for the engine, SamplingParams per request.

EngineConfig is one frozen dataclass, validated once, built at start-up and passed
explicitly to the scheduler, block manager and runner; nothing reads settings from globals
or the environment after this point. SamplingParams says how one request wants its tokens
chosen and when it stops. Pure Python (no torch), so the scheduler and the server can
validate requests without touching the model. Their command-line flags are in
minicb/engine_options.py.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from minicb.core.feature_settings import (
    OPTIONS,
    RECORDS,
    FeatureSettings,
    check_choice,
    check_positive,
)
from minicb.core.registry import FeatureNotLoaded

BATCHING_MODES = ("continuous", "static")
POLICIES = ("fcfs", "priority")
STATIC_ORDERS = ("arrival", "length")
PREEMPTION_MODES = ("recompute", "swap")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
DTYPES = ("auto", "float32", "bfloat16", "float16")

S = TypeVar("S", bound=FeatureSettings)


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling limits and engine choices. See README for what each one teaches.

    Each optional feature's settings are a record of its own in ``features``
    (feature_settings.py); build a config from flat option names, the core's and the
    features' alike, with ``from_kwargs`` and change one with ``with_``."""

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
    preemption_mode: str = "recompute"
    # How the static baseline picks a new batch from the queue: "arrival" (the policy's
    # order) or "length" (similar max_tokens together, so less padding).
    static_order: str = "arrival"
    # Priority aging: a waiting request's effective priority improves by one level
    # every `aging_steps` iterations, so nobody waits forever.
    aging_steps: int = 16
    attention_backend: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None  # None: the model's own context length
    # The share of free memory the KV pool may take when sized automatically.
    kv_memory_fraction: float = 0.5
    seed: int = 0
    # The records of the features this config turns on (each differs from its defaults),
    # sorted by name; a feature not here runs with its defaults (``Record.of(config)``).
    features: tuple[FeatureSettings, ...] = ()

    def __post_init__(self) -> None:
        check_choice("batching", self.batching, BATCHING_MODES)
        check_choice("policy", self.policy, POLICIES)
        check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        check_choice("static_order", self.static_order, STATIC_ORDERS)
        check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        check_choice("dtype", self.dtype, DTYPES)
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "aging_steps"):
            check_positive(name, getattr(self, name))
        if self.num_kv_blocks is not None:
            check_positive("num_kv_blocks", self.num_kv_blocks)
        if self.num_swap_blocks is not None and self.num_swap_blocks < 0:
            raise ValueError(f"num_swap_blocks must be >= 0, got {self.num_swap_blocks}")
        if self.max_model_len is not None:
            check_positive("max_model_len", self.max_model_len)
        if not 0.0 < self.kv_memory_fraction <= 1.0:
            raise ValueError(f"kv_memory_fraction must be in (0, 1], got {self.kv_memory_fraction}")
        # One record per feature, defaults left out, in name order: two configs that say
        # the same are equal (and hash alike) however they were built.
        records = {record.name: record for record in self.features}
        if len(records) != len(self.features):
            raise ValueError("features holds two records of the same feature")
        kept = tuple(r for _, r in sorted(records.items()) if r != type(r)())
        object.__setattr__(self, "features", kept)
        for record in kept:
            record.check(self)

    def feature(self, record: type[S]) -> S:
        """The ``record`` this config holds, or that record's defaults."""
        for held in self.features:
            if isinstance(held, record):
                return held
        return record()

    def answer(self, seam: str, default: Any) -> Any:
        """What a record this config holds answers for ``seam`` (its ``answers``), or
        ``default`` when none does: how a seam learns its choice without naming a feature.
        (A feature at its defaults is not held, and leaves the seam its default.)"""
        for record in self.features:
            attribute = record.answers.get(seam)
            if attribute is not None and getattr(record, attribute) is not None:
                return getattr(record, attribute)
        return default

    @classmethod
    def from_kwargs(cls, **options: Any) -> EngineConfig:
        """Build from flat option names (the core's and the loaded features'), naming any
        that nobody knows."""
        return cls().with_(**options)

    def with_(self, **options: Any) -> EngineConfig:
        """This config with some flat options changed, each in the record that owns it."""
        core = {f.name for f in fields(self)} - {"features"}
        _refuse_unknown({n: v for n, v in options.items() if n not in core and n not in OPTIONS})
        changes: dict[type[FeatureSettings], dict[str, Any]] = {}
        for name in set(options) - core:
            changes.setdefault(OPTIONS[name], {})[name] = options[name]
        changed = {record.name: replace(self.feature(record), **c) for record, c in changes.items()}
        records = {record.name: record for record in self.features} | changed
        kept = {name: value for name, value in options.items() if name in core}
        return replace(self, **kept, features=tuple(records.values()))

    def to_dict(self) -> dict[str, Any]:
        """Every option flat, the core's and every loaded feature's: the words a trace, the
        page and a scenario file use."""
        flat = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "features"}
        for record in RECORDS.values():
            held = self.feature(record)
            flat |= {f.name: getattr(held, f.name) for f in fields(held)}  # type: ignore[arg-type]
        return flat


def _refuse_unknown(unknown: dict[str, Any]) -> None:
    """Names no loaded record owns: a typo once every feature is loaded (TypeError, as a
    wrong keyword is), else perhaps a feature nobody imported (FeatureNotLoaded)."""
    if not unknown:
        return
    if "minicb.features" in sys.modules:
        raise TypeError(f"unknown engine option(s): {', '.join(sorted(unknown))}")
    asked = ", ".join(f"{name}={value!r}" for name, value in sorted(unknown.items()))
    raise FeatureNotLoaded("engine option", min(unknown), asked, OPTIONS)


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
