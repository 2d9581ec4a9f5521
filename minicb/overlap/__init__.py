"""Overlap scheduling: schedule step N+1 on the host while the device runs step N.

It enters the core as a step strategy (seam 5, minicb/core/step_strategy.py) named
"overlap": importing this package registers a factory that imports the loop itself
(pipeline.py) only when an engine asks for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minicb.core.feature_settings import register_settings
from minicb.core.step_strategy import register_step_strategy
from minicb.overlap.settings import OverlapSettings

if TYPE_CHECKING:
    from minicb.core.engine import LLMEngine
    from minicb.overlap.pipeline import OverlapStep


def _overlap_step(engine: LLMEngine) -> OverlapStep:
    from minicb.overlap.pipeline import OverlapStep

    return OverlapStep(engine)


register_settings(OverlapSettings)
register_step_strategy("overlap", _overlap_step)
