"""KV reservation's setting (its record in ``EngineConfig.features``).

``kv_reservation`` names the KV cache given at admission (the scheduler's admission-size
hook, seam 1; modes.py): "paged" (the core's: nothing ahead, blocks as tokens come), or
prompt + "max" (max_tokens), "pow2" (the expected output rounded up to a power of two),
"oracle" (exactly it). Continuous batching only. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from minicb.core.feature_settings import FeatureSettings, check_choice

KV_RESERVATIONS = ("paged", "max", "pow2", "oracle")


@dataclass(frozen=True)
class ReservationSettings(FeatureSettings):
    name: ClassVar[str] = "reservation"
    answers: ClassVar[dict[str, str]] = {"admission size": "kv_reservation"}

    kv_reservation: str = "paged"

    def __post_init__(self) -> None:
        check_choice("kv_reservation", self.kv_reservation, KV_RESERVATIONS)
