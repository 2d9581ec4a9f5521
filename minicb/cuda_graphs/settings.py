"""CUDA graphs' setting (its record in ``EngineConfig.features``).

``use_cuda_graphs``: capture decode steps once per batch size and replay them (capture.py),
on a CUDA device and one rank. On by default. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from minicb.core.feature_settings import FeatureSettings


@dataclass(frozen=True)
class CudaGraphSettings(FeatureSettings):
    name: ClassVar[str] = "cuda_graphs"

    use_cuda_graphs: bool = True
