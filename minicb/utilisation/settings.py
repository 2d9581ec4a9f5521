"""Utilisation's setting (its record in ``EngineConfig.features``).

``measure_utilisation``: the real model runner reports each step's bandwidth and FLOP
utilisation against this machine's measured copy bandwidth and matmul FLOP/s
(occupancy.py); the probes take a few seconds, once per process. On in the demo and serve,
off elsewhere. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from minicb.core.feature_settings import FeatureSettings


@dataclass(frozen=True)
class UtilisationSettings(FeatureSettings):
    name: ClassVar[str] = "utilisation"

    measure_utilisation: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.measure_utilisation, bool):
            raise ValueError(
                f"measure_utilisation must be True or False, got {self.measure_utilisation!r}"
            )
