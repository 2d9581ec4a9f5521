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
    from collections.abc import Callable

    from minicb.core.config import EngineConfig
    from minicb.core.runner.model_runner import ModelRunner
    from minicb.core.scheduler.block_manager import BlockManager
    from minicb.speculation.draft_networks import DraftNetwork
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

    def network(s: SpeculationSettings, target: ModelRunner) -> DraftNetwork:
        return draft_networks.draft_model(s.draft_model, target)

    return _network_drafter(config, blocks, max_model_len, network, "the draft model")


def early_exit(config: EngineConfig, blocks: BlockManager, max_model_len: int) -> Drafter:
    from minicb.speculation import draft_networks

    def network(s: SpeculationSettings, target: ModelRunner) -> DraftNetwork:
        return draft_networks.early_exit(s.draft_layers, target)

    return _network_drafter(config, blocks, max_model_len, network, "the target's first layers")


def _network_drafter(
    config: EngineConfig,
    blocks: BlockManager,
    max_model_len: int,
    network: Callable[[SpeculationSettings, ModelRunner], DraftNetwork],
    by: str,
) -> Drafter:
    """A drafter whose proposer runs ``network`` (built once the engine attaches the
    runner: it needs the target's device, backend and, for early exit, its weights)."""
    from minicb.speculation.drafter import Drafter
    from minicb.speculation.model_proposer import ModelProposer

    s = read_settings(config)
    proposer = ModelProposer(lambda target: network(s, target), s.num_speculative_tokens, by)
    return Drafter(proposer, s.num_speculative_tokens, blocks, max_model_len)
