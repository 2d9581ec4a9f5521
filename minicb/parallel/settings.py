"""Tensor parallelism's setting (its record in ``EngineConfig.features``).

``tensor_parallel_size``: the ranks the model is split over (Megatron-style): rank 0 runs
the engine, ranks 1..N-1 run their shard of every layer (tp_group.py). Features that are
not built for more than one rank check this record in their own ``check``. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from minicb.core.feature_settings import FeatureSettings, check_positive


@dataclass(frozen=True)
class ParallelSettings(FeatureSettings):
    name: ClassVar[str] = "parallel"

    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        check_positive("tensor_parallel_size", self.tensor_parallel_size)
