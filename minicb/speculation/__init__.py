"""Speculative decoding: propose draft tokens, verify them in one step, keep the accepted.

Importing this package registers its settings record (settings.py: ``SpeculationSettings``,
its place in ``EngineConfig.features``) and its drafters at the scheduler's hook (seam 1,
minicb/core/scheduler/hooks.py) under the words its setting ``speculative`` takes. The
factory imports the drafter only when an engine asks for it: a proposer that runs a model
will need torch, and ``import minicb.features`` must not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minicb.core.feature_settings import register_settings
from minicb.core.scheduler.hooks import DRAFTERS
from minicb.speculation.settings import SpeculationSettings

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig
    from minicb.core.scheduler.block_manager import BlockManager
    from minicb.speculation.drafter import Drafter


def _ngram(config: EngineConfig, blocks: BlockManager, max_model_len: int) -> Drafter:
    from minicb.speculation.drafter import Drafter
    from minicb.speculation.ngram import NgramProposer

    settings = SpeculationSettings.of(config)
    proposer = NgramProposer(settings.ngram_min, settings.ngram_max)
    return Drafter(proposer, settings.num_speculative_tokens, blocks, max_model_len)


register_settings(SpeculationSettings)
DRAFTERS["ngram"] = _ngram
