"""Weight packing's setting (its record in ``EngineConfig.features``).

``packed_weights``: bfloat16 on CPU, linear layers read weights packed once for oneDNN
(packed.py); False keeps plain nn.Linear, the reference. On by default. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from minicb.core.feature_settings import FeatureSettings


@dataclass(frozen=True)
class PackingSettings(FeatureSettings):
    name: ClassVar[str] = "packing"

    packed_weights: bool = True
