"""Batch invariance's setting (its record in ``EngineConfig.features``).

``batch_invariant``: linears in fixed row tiles and attention for each token alone in fixed
key tiles (batch_invariant.py), so a token's numbers never depend on its batch. Slower;
what makes an 8-bit KV cache's greedy tokens equal across batch sizes, chunk sizes and
preemption. Torch attention, one process. The core's backend choice learns it as
``config.answer("attention backend", ...)``. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from minicb.core.feature_settings import FeatureSettings
from minicb.parallel.settings import ParallelSettings

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig


@dataclass(frozen=True)
class BatchInvariantSettings(FeatureSettings):
    name: ClassVar[str] = "batch_invariance"
    answers: ClassVar[dict[str, str]] = {"attention backend": "backend"}

    batch_invariant: bool = False

    @property
    def backend(self) -> str | None:
        """The attention backend batch invariance needs (None: the config's own choice)."""
        return "batch_invariant" if self.batch_invariant else None

    def check(self, config: EngineConfig) -> None:
        if self.batch_invariant and config.attention_backend == "triton":
            raise ValueError(
                "batch_invariant attention is built on torch: use attention_backend torch or "
                "auto (it takes torch then), not triton"
            )
        if self.batch_invariant and ParallelSettings.of(config).tensor_parallel_size > 1:
            raise ValueError("batch_invariant is not built for tensor_parallel_size > 1")
