"""Scheduler hooks (seam 1): where an optional feature changes what the scheduler decides.

The scheduler's own course (running requests, swap-ins, admissions, then ``update`` with
the sampled tokens) is the same whatever features are on. A feature changes it at three
named moments, and only there:

- **after schedule**, a ``Drafter`` may lengthen decode rows with guessed tokens (speculative
  decoding), out of the budget and blocks nobody else needs;
- **before update**, the same ``Drafter`` says which of a drafted row's sampled tokens are
  kept (acceptance), and after them gives back what only rejected guesses held (a draft
  drawn from a distribution is verified in the runner instead, by the ``DraftVerifier``
  the drafter installs there when the engine ``attach``es it to its runner);
- **at admission**, an ``AdmissionSize`` says how much KV a request is given at once. The
  core's own is ``paged`` (nothing ahead: blocks come as tokens are written); the
  reservation baselines (max, pow2, oracle) are a feature.

Each hook is found by name, from the config's field (``speculative``,
``kv_reservation``), in a registry below. The core registers only ``paged``; a feature's
package registers its own when it is imported (``minicb/speculation/__init__.py``,
``minicb/reservation/__init__.py``), and ``import minicb.features`` imports them all
(``import minicb`` does it). A name the config accepts but nobody registered raises
``FeatureNotLoaded`` (minicb/core/registry.py), which says so. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from minicb.core.registry import lookup

if TYPE_CHECKING:
    import torch

    from minicb.core.config import EngineConfig
    from minicb.core.request import Request
    from minicb.core.runner import Runner
    from minicb.core.scheduler.block_manager import BlockManager
    from minicb.core.scheduler.plan import ScheduledRequest, StepPlan


class Drafter(Protocol):
    """Speculative decoding's hooks: guesses added after schedule, kept or dropped before
    update. A drafted row feeds its guesses after its last token (``num_draft_tokens`` of
    them) and gets a sampled token back at each of its positions."""

    def draft(self, plan: StepPlan, requests: dict[int, Request], budget: int) -> None:
        """After schedule: lengthen decode rows of ``plan`` by guesses, out of ``budget``
        (the tokens nobody else needs) and free blocks, never preempting or evicting."""
        ...

    def accept(self, row: ScheduledRequest, sampled: list[int]) -> list[int]:
        """Before update: the tokens a drafted row yields, from the tokens sampled at its
        positions (one or more: the last one the model chose after the kept guesses)."""
        ...

    def settle(self, row: ScheduledRequest, req: Request, kept: int) -> None:
        """After update: ``kept`` of the row's tokens became output (a stop may cut them
        short of what ``accept`` gave); count them, and give back the blocks taken only
        for guesses that were dropped."""
        ...

    def attach(self, runner: Runner) -> None:
        """Once the engine has its runner and its scheduler: a drafter that runs a model (a
        draft model, the target's own first layers) takes what it needs from the runner
        (device, attention backend, the target's weights), and one whose drafts carry
        distributions installs its ``DraftVerifier`` there. The factory cannot be handed the
        runner: the scheduler builds the drafter, and the scheduler knows no runner."""
        ...


class DraftVerifier(Protocol):
    """The runner's side of speculation, for drafts drawn from a distribution ``q`` (a
    draft model sampling): such a draft is verified by rejection sampling on the target's
    logits, which only the runner has. A point-mass draft (n-gram, greedy) needs none: the
    runner draws at each position as for any row, and ``Drafter.accept`` keeps the prefix."""

    def verify(
        self, row: ScheduledRequest, logits: torch.Tensor, generator: torch.Generator
    ) -> list[int] | None:
        """The tokens a drafted row yields, from its logits (1 + d, vocab); None: the row is
        sampled as any other."""
        ...


@dataclass(frozen=True)
class Reservation:
    """KV set aside for a request at its admission, beyond what its first step writes."""

    mode: str  # its name in the config, for a note when it does not fit: "max"
    num_tokens: int  # tokens of KV the request holds from its admission on
    words: str  # added to the admission's reason: "; reserves 9 blocks for 40 + 100 tokens"


class AdmissionSize(Protocol):
    """How much KV an admission takes at once, and what to say when a request outgrows it."""

    def reserve(self, req: Request, num_tokens: int, max_model_len: int) -> Reservation | None:
        """What ``req`` is given at admission, where its first step holds ``num_tokens``
        (None: just those)."""
        ...

    def outgrew(self, req: Request, num_blocks: int) -> str | None:
        """A note when a running request needs ``num_blocks`` more blocks (None: no news)."""
        ...


class Paged:
    """The core's admission size (vLLM's): nothing ahead, blocks one at a time as tokens
    are written, so growing is the normal course and worth no note."""

    def reserve(self, req: Request, num_tokens: int, max_model_len: int) -> None:
        return None

    def outgrew(self, req: Request, num_blocks: int) -> None:
        return None


DrafterFactory = Callable[["EngineConfig", "BlockManager", int], Drafter]

# Registries: a name -> what builds the hook. Features add to them on import. The name a
# config asks for is its feature record's answer (feature_settings.py): ``config.answer(
# "drafter", "off")`` ("off": none) and ``config.answer("admission size", "paged")``.
DRAFTERS: dict[str, DrafterFactory] = {}
ADMISSION_SIZES: dict[str, Callable[[EngineConfig], AdmissionSize]] = {
    "paged": lambda config: Paged(),
}


def make_drafter(config: EngineConfig, blocks: BlockManager, max_model_len: int) -> Drafter | None:
    """The drafter ``config`` asks for, or None when speculation is off."""
    name = config.answer("drafter", "off")
    if name == "off":
        return None
    factory = lookup(DRAFTERS, "drafter", name, f"the config's drafter {name!r}")
    return factory(config, blocks, max_model_len)


def attach_runner(drafter: Drafter | None, runner: Runner) -> None:
    """The engine's one call into speculation once runner and scheduler both exist."""
    if drafter is not None:
        drafter.attach(runner)


def make_admission_size(config: EngineConfig) -> AdmissionSize:
    """The admission size ``config`` asks for (the core's "paged" unless a feature says)."""
    name = config.answer("admission size", "paged")
    asked_by = f"the config's admission size {name!r}"
    return lookup(ADMISSION_SIZES, "admission size", name, asked_by)(config)
