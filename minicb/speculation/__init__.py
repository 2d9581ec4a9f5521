"""Speculative decoding: propose draft tokens, verify them in one step, keep the accepted.

Importing this package registers its settings record (settings.py: ``SpeculationSettings``,
its place in ``EngineConfig.features``) and its drafters at the scheduler's hook (seam 1,
minicb/core/scheduler/hooks.py) under the words its setting ``speculative`` takes: the
n-gram (ngram.py), a draft model and early exit (model_proposer.py, draft_networks.py). The
factories (factories.py) import a drafter only when an engine asks for it: a proposer that
runs a model needs torch, and ``import minicb.features`` must not.
"""

from __future__ import annotations

from minicb.core.feature_settings import register_settings
from minicb.core.scheduler.hooks import DRAFTERS
from minicb.speculation import factories
from minicb.speculation.settings import SpeculationSettings

register_settings(SpeculationSettings)
DRAFTERS["ngram"] = factories.ngram
DRAFTERS["draft"] = factories.draft_model
DRAFTERS["early_exit"] = factories.early_exit
