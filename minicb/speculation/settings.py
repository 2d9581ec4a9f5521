"""Speculative decoding's settings (its record in ``EngineConfig.features``).

``speculative`` names the drafter (the scheduler's hook, seam 1): "ngram" lets a decode row
(at any temperature: the draws keep the model's distribution, docs/speculative.md) propose
up to ``num_speculative_tokens`` tokens that followed an earlier occurrence of its last
``ngram_min``..``ngram_max`` tokens, verified in the same forward pass as everyone else.
"draft": a draft model (a model folder with the target's tokenizer, or the default model's
name) proposes the tokens; "early_exit": the target's first ``draft_layers`` layers and its
LM head do (self-speculation). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from minicb.core.feature_settings import FeatureSettings, check_choice, check_positive

SPECULATIVE_MODES = ("off", "ngram", "draft", "early_exit")


@dataclass(frozen=True)
class SpeculationSettings(FeatureSettings):
    name: ClassVar[str] = "speculation"
    answers: ClassVar[dict[str, str]] = {"drafter": "speculative"}

    speculative: str = "off"
    num_speculative_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 4
    draft_model: str | None = None
    draft_layers: int | None = None

    def __post_init__(self) -> None:
        check_choice("speculative", self.speculative, SPECULATIVE_MODES)
        for name in ("num_speculative_tokens", "ngram_min", "ngram_max"):
            check_positive(name, getattr(self, name))
        if self.draft_layers is not None:
            check_positive("draft_layers", self.draft_layers)
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})"
            )
