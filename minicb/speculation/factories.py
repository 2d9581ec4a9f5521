"""The drafters the ``speculative`` setting names, built from the settings they read.

Each factory is a ``DrafterFactory`` (minicb/core/scheduler/hooks.py): the scheduler calls it
with the config, its block manager and the context length. The n-gram needs nothing else; a
model proposer (a draft model, early exit) needs the target's weights and device, which the
scheduler does not have: its network is built when the engine attaches the drafter to its
runner (``Drafter.attach``). Imports of torch happen inside the factories, when an engine
asks for one: ``import minicb.features`` loads none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig
    from minicb.core.scheduler.block_manager import BlockManager
    from minicb.speculation.drafter import Drafter
    from minicb.speculation.settings import SpeculationSettings


def read_settings(config: EngineConfig) -> SpeculationSettings:
    """What the proposers read of the config (its speculation record): the one place that
    knows where the settings are kept."""
    from minicb.speculation.settings import SpeculationSettings

    return SpeculationSettings.of(config)


def ngram(config: EngineConfig, blocks: BlockManager, max_model_len: int) -> Drafter:
    from minicb.speculation.drafter import Drafter
    from minicb.speculation.ngram import NgramProposer

    s = read_settings(config)
    proposer = NgramProposer(s.ngram_min, s.ngram_max)
    return Drafter(proposer, s.num_speculative_tokens, blocks, max_model_len)


def draft_model(config: EngineConfig, blocks: BlockManager, max_model_len: int) -> Drafter:
    from minicb.speculation import draft_networks
    from minicb.speculation.drafter import Drafter
    from minicb.speculation.model_proposer import ModelProposer

    s = read_settings(config)
    proposer = ModelProposer(
        lambda target: draft_networks.draft_model(s.draft_model, target),
        s.num_speculative_tokens,
        "the draft model",
    )
    return Drafter(proposer, s.num_speculative_tokens, blocks, max_model_len)


def early_exit(config: EngineConfig, blocks: BlockManager, max_model_len: int) -> Drafter:
    from minicb.speculation import draft_networks
    from minicb.speculation.drafter import Drafter
    from minicb.speculation.model_proposer import ModelProposer

    s = read_settings(config)
    proposer = ModelProposer(
        lambda target: draft_networks.early_exit(s.draft_layers, target),
        s.num_speculative_tokens,
        "the target's first layers",
    )
    return Drafter(proposer, s.num_speculative_tokens, blocks, max_model_len)
