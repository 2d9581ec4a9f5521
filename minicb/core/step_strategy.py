"""Seam 5, the step strategy: a whole other loop in place of ``LLMEngine.step``'s plain one.

The plain loop (schedule, execute, update, publish: minicb/core/engine.py) is the core's,
and it is what runs unless the config asks for another. A feature that steps the engine
differently (overlap scheduling plans the next iteration while the device computes this
one: minicb/overlap/) writes its own whole loop as a ``StepStrategy`` and registers a
factory for it under its name, in its own package's ``__init__.py``. The engine builds the
strategy its config names through ``STEP_STRATEGIES`` and calls it from ``step()``; the
core never names the feature behind a name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from minicb.core.registry import lookup

if TYPE_CHECKING:
    from minicb.core.engine import LLMEngine
    from minicb.core.output_processor import StepResult


class StepStrategy(Protocol):
    """A loop that runs one engine's steps in its own way."""

    # The step launched and not reported yet, or None: while there is one the engine has
    # work left, and the KV changes made between steps wait to go out with its report.
    in_flight: Any

    def step(self) -> StepResult:
        """One ``LLMEngine.step()``: a step event, its new tokens, its finished requests."""
        ...

    def close(self) -> None:
        """The engine is being replaced: finish what is in flight, let its threads go."""
        ...


# name -> a factory called with the engine (after its scheduler, runner and collaborators
# are built) that returns the strategy.
STEP_STRATEGIES: dict[str, Callable[[LLMEngine], StepStrategy]] = {}


def register_step_strategy(name: str, factory: Callable[[LLMEngine], StepStrategy]) -> None:
    """Called by a feature's package when it is imported (see minicb/features.py)."""
    STEP_STRATEGIES[name] = factory


def build_step_strategy(engine: LLMEngine) -> StepStrategy | None:
    """The strategy ``engine``'s config asks for (a feature's record answers the "step
    strategy" seam, feature_settings.py), built; None for the plain loop."""
    name = engine.config.answer("step strategy", None)
    if name is None:
        return None
    return lookup(STEP_STRATEGIES, "step strategy", name, "the config")(engine)
