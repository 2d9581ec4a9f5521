"""The real continuous scheduler with a student's admission policy in its seam.

``ContinuousScheduler.admission_order`` is where the scheduler asks "who of the waiting is
tried next, in what order"; ``PolicyScheduler`` answers it with the policy's ``admit(view)``.
Everything else (running requests, preemption, chunking, the block pool, the engine's own
stop at the first request the limits refuse) is the real code, unchanged.

Two kinds of wrong choice are told apart:

- one the engine cannot act on (not a list of ids, an id twice, an id that is not waiting)
  is refused at once with ``ChoiceRefused``: admitting a request twice would put two rows of
  it in one batch;
- one that breaks a limit (more requests than free slots, a request with no budget left,
  more blocks than are free) is what the policy is graded on: ``broken_limit`` names it.
  The engine itself never goes past a limit: it stops at the first request that does not
  fit, so the limits hold whatever the policy says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from minicb.core.request import Request
from minicb.core.scheduler import ContinuousScheduler
from minicb.graded_labs.coding.contract import AdmissionView, WaitingRequest

Admit = Callable[[AdmissionView], Sequence[int]]
OnChoice = Callable[[AdmissionView, list[int]], None]


class ChoiceRefused(ValueError):
    """The policy returned something the engine cannot admit."""


class PolicyScheduler(ContinuousScheduler):
    """Continuous batching whose admission order is ``admit(view)``'s."""

    def __init__(self, *args: Any, admit: Admit, on_choice: OnChoice | None = None) -> None:
        super().__init__(*args)
        self.admit, self.on_choice = admit, on_choice

    def admission_order(self, budget: int) -> list[Request]:
        view = self.view(budget)
        ids = checked_ids(self.admit(view), view)
        if self.on_choice is not None:
            self.on_choice(view, ids)
        by_id = {req.request_id: req for req in self.waiting}
        return [by_id[i] for i in ids]

    def view(self, budget: int) -> AdmissionView:
        """This moment as the policy sees it: copies, in the queue's own order."""
        waiting = tuple(
            WaitingRequest(
                request_id=req.request_id,
                arrival_step=req.arrival_step,
                waited_steps=self.step_count - req.arrival_step,
                num_prompt_tokens=req.num_prompt_tokens,
                num_tokens=req.num_tokens,
                priority=req.priority,
                preempted=req.metrics.num_preemptions > 0,
            )
            for req in self.waiting
        )
        return AdmissionView(
            step=self.step_count,
            waiting=waiting,
            free_slots=self.config.max_num_seqs - len(self.running),
            token_budget=budget,
            free_blocks=self.blocks.num_free_blocks,
            block_size=self.config.block_size,
        )


def checked_ids(chosen: Any, view: AdmissionView) -> list[int]:
    """``chosen`` as a list of distinct waiting ids, or ChoiceRefused saying what it is."""
    if not isinstance(chosen, (list, tuple)):
        raise ChoiceRefused(f"admit() returned a {type(chosen).__name__}, not a list of ids")
    waiting = {w.request_id for w in view.waiting}
    seen: set[int] = set()
    for rid in chosen:
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise ChoiceRefused(f"admit() returned {rid!r} among the ids: ids are ints")
        if rid in seen:
            raise ChoiceRefused(f"admit() returned request {rid} twice in one iteration")
        if rid not in waiting:
            raise ChoiceRefused(f"admit() returned request {rid}, which is not waiting")
        seen.add(rid)
    return list(chosen)


def broken_limit(view: AdmissionView, ids: list[int]) -> str | None:
    """The first limit the choice breaks, in words, or None: each chosen request needs a
    slot, some of the budget (it takes ``min(num_tokens, budget left)``) and the blocks for
    those tokens."""
    tokens = {w.request_id: w.num_tokens for w in view.waiting}
    slots, budget, blocks = view.free_slots, view.token_budget, view.free_blocks
    for rid in ids:
        if slots == 0:
            return (f"batch slots: at iteration {view.step} your choice admits {len(ids)} "
                    f"requests with {view.free_slots} free slots")  # fmt: skip
        if budget == 0:
            return (f"token budget: at iteration {view.step} request {rid} is admitted after "
                    f"the budget of {view.token_budget} tokens is spent")  # fmt: skip
        n = min(tokens[rid], budget)
        if view.blocks_for(n) > blocks:
            return (f"KV blocks: at iteration {view.step} request {rid} needs "
                    f"{view.blocks_for(n)} blocks for its {n} tokens, and only {blocks} of "
                    f"the {view.free_blocks} free blocks are left for it")  # fmt: skip
        slots, budget, blocks = slots - 1, budget - n, blocks - view.blocks_for(n)
    return None


def policy_engine(
    admit: Admit,
    config: Any,
    *,
    on_choice: OnChoice | None = None,
    model: str | None = None,
    runner: Any = None,
    clock: Any = None,
) -> Any:
    """An engine whose scheduler admits by ``admit``, through the engine's scheduler seam."""
    from minicb.core.engine import LLMEngine

    def build(*args: Any) -> PolicyScheduler:
        return PolicyScheduler(*args, admit=admit, on_choice=on_choice)

    return LLMEngine(model, config, runner=runner, clock=clock, scheduler=build)
