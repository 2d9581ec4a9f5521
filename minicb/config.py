"""EngineConfig: every engine setting in one frozen dataclass, validated once.

Built at start-up and passed explicitly to the scheduler, block manager and runner;
nothing reads settings from globals or the environment after this point.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

BATCHING_MODES = ("continuous", "static")
POLICIES = ("fcfs", "priority")
PREEMPTION_MODES = ("recompute", "swap")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
DTYPES = ("auto", "float32", "bfloat16", "float16")


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
    preemption_mode: str = "recompute"
    # Priority aging: a waiting request's effective priority improves by one level
    # every `aging_steps` iterations, so nobody waits forever.
    aging_steps: int = 16
    attention_backend: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None  # None: the model's own context length
    kv_memory_fraction: float = (
        0.5  # share of free memory the pool may take when sized automatically
    )
    use_cuda_graphs: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        self._check_choice("batching", BATCHING_MODES)
        self._check_choice("policy", POLICIES)
        self._check_choice("preemption_mode", PREEMPTION_MODES)
        self._check_choice("attention_backend", ATTENTION_BACKENDS)
        self._check_choice("dtype", DTYPES)
        self._check_positive("max_num_seqs")
        self._check_positive("max_num_batched_tokens")
        self._check_positive("block_size")
        self._check_positive("aging_steps")
        if self.num_kv_blocks is not None:
            self._check_positive("num_kv_blocks")
        if self.num_swap_blocks is not None and self.num_swap_blocks < 0:
            raise ValueError(f"num_swap_blocks must be >= 0, got {self.num_swap_blocks}")
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
