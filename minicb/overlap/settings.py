"""Overlap scheduling's setting (its record in ``EngineConfig.features``).

``overlap_scheduling``: plan iteration N+1 while the runner executes N, with N's tokens as
placeholders; finishes are learnt one iteration late and the extra row is discarded. With
speculative decoding, a plan that verifies drafts is waited for before the next is planned
(its accepted count places the next rows). The core's step-strategy seam learns it as
``config.answer("step strategy", None)``. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from minicb.core.feature_settings import FeatureSettings


@dataclass(frozen=True)
class OverlapSettings(FeatureSettings):
    name: ClassVar[str] = "overlap"
    answers: ClassVar[dict[str, str]] = {"step strategy": "strategy"}

    overlap_scheduling: bool = False

    @property
    def strategy(self) -> str | None:
        """The step strategy this asks for (None: the plain loop)."""
        return "overlap" if self.overlap_scheduling else None
