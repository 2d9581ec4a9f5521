"""Speculative decoding's scheduler hooks: drafts added to a plan, acceptance, rollback.

A decode row normally brings one token (the last one generated) and gets one new token back.
With a draft of ``d`` guessed tokens it brings ``1 + d``, the runner samples at every one of
those positions in the same ragged forward pass as everyone else's work (a query of
``1 + d`` tokens at the end of the context: the chunked-prefill attention path), and
acceptance keeps the longest prefix of the draft that equals the model's own tokens there,
plus the model's token after it (the "bonus"): between 1 and ``1 + d`` tokens per step, and
exactly the tokens the model would have produced one step at a time.

That holds at any temperature. A greedy row's tokens are its argmaxes. A sampled row's are
drawn at each position from the filtered distribution there, each from the generator of
its token index when the request is seeded; keeping them while they equal the draft is
rejection sampling for a draft that is a point mass (rejection.py says why), so the kept
tokens have the model's distribution, and a seeded request's are the ones it would get
with speculation off.

``Drafter`` fills the core's drafter hooks (minicb/core/scheduler/hooks.py). Who guesses is
a ``Proposer``: it gets every row to draft for at once (a draft model runs them as one
batch) and returns up to each row's ``max_tokens`` guesses, each with the distribution
``q`` it was drawn from where the proposer has one. Three proposers: the n-gram (ngram.py:
point-mass guesses, ``q`` None), a draft model and the target's own first layers
(model_proposer.py). A sampled row whose draft carries ``q`` cannot be verified by drawing
and comparing (that is the rule for a point mass only): the runner then hands its logits to
``Drafter.verify``, which runs the rejection sampler (rejection.py) on them. Pure Python, no
torch at import: the scheduler calls it while it builds the StepPlan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from minicb.core.request import RequestStatus
from minicb.core.scheduler.block_manager import BlockManager, blocks_needed
from minicb.core.scheduler.plan import DECODE, Decision, ScheduledRequest, StepPlan

if TYPE_CHECKING:
    import torch

    from minicb.core.config import SamplingParams
    from minicb.core.request import Request
    from minicb.core.runner import Runner


@dataclass(frozen=True)
class DraftRequest:
    """A row to draft for: the request's tokens so far and how many guesses fit."""

    request_id: int
    token_ids: Sequence[int]  # prompt + output so far
    max_tokens: int  # at least 1
    params: SamplingParams | None = None  # how the request samples (None: greedy)


@dataclass(frozen=True)
class Draft:
    """Guessed next tokens of one request, and where the guess came from."""

    tokens: list[int]  # the proposed continuation, at most the max_tokens asked for
    ngram: list[int] = field(default_factory=list)  # the suffix matched (n-gram only)
    position: int = 0  # where that suffix appeared before, as an index into the tokens
    # (len(tokens), vocab) the distribution each token was drawn from; None for a point
    # mass (the n-gram's guesses, a greedy draft model's argmaxes).
    q: torch.Tensor | None = None
    by: str = "the n-gram"  # who proposed it, in words for the reason

    def cut(self, start: int, stop: int | None = None) -> Draft:
        """The guesses ``start:stop`` with their distributions."""
        q = None if self.q is None else self.q[start:stop]
        return replace(self, tokens=self.tokens[start:stop], q=q)


class Proposer(Protocol):
    def propose(self, rows: Sequence[DraftRequest]) -> list[Draft | None]:
        """For each row, in order, up to ``row.max_tokens`` guesses of what follows
        ``row.token_ids``, or None when there is no guess worth checking."""
        ...

    # Two more methods, optional (a proposer that keeps nothing, the n-gram, has neither):
    # ``attach(runner)``: the engine's runner, once it exists; a proposer that runs a model
    # takes its device, attention backend and (self-speculation) weights from it.
    # ``retain(request_ids)``: forget every request but these (the running ones); one that
    # keeps state per request (a draft model's KV) frees what a finished, aborted or
    # preempted request held.


def accept_greedy(draft: Sequence[int], verified: Sequence[int]) -> list[int]:
    """The tokens a verified row yields: ``verified[i]`` is the model's token after the
    row's ``i``-th input (``i = 0``: after the last real token; ``i > 0``: after draft token
    ``i - 1``), its argmax or, for a sampled row, its draw. Keep the model's tokens while the
    draft agreed with them, then the first one where it did not (or the bonus token after a
    fully accepted draft)."""
    m = 0
    while m < len(draft) and m + 1 < len(verified) and draft[m] == verified[m]:
        m += 1
    return list(verified[: m + 1])


def draft_reason(draft: Draft, num_drafted: int, slots: int, limit: str | None) -> str:
    """Why a decode row drafts what it does, e.g. "drafts 3 tokens: the n-gram of 2 tokens
    appeared at position 12". ``slots``: what the free KV blocks hold for drafts; ``limit``:
    the words for the limit that cut the lookup short, if one did. The n-gram is told by
    its length, never its tokens: a reason reaches pages that may not read the request's
    text (minicb.server.redaction)."""
    size = len(draft.ngram)
    found = (
        f"the n-gram of {size} token{'s' if size != 1 else ''} appeared at position "
        f"{draft.position}"
        if size
        else f"{draft.by} proposed them"
    )
    if num_drafted == 0:
        return f"drafts nothing: {found}, but no free KV block is left for drafts"
    words = f"drafts {num_drafted} token{'s' if num_drafted > 1 else ''}: {found}"
    if num_drafted < len(draft.tokens):
        return words + f"; trimmed from {len(draft.tokens)}: the free KV blocks hold {slots} more"
    return words + (f"; {limit}" if limit else "")


@dataclass
class _Ask:
    """One row's question to the proposer, and what bounds its answer."""

    row: ScheduledRequest
    limits: dict[str, int]  # each limit's words -> the draft tokens it leaves room for
    guessing: bool  # the last token is an overlap placeholder: the proposer guesses it too
    request: DraftRequest  # what the proposer is asked


class Drafter:
    """Adds drafts to a plan's decode rows, within what nobody else needs: the
    scheduler calls it last, with the budget that running requests, swap-ins and admissions
    left over."""

    def __init__(
        self,
        proposer: Proposer,
        num_tokens: int,
        blocks: BlockManager,
        max_model_len: int,
    ) -> None:
        self.proposer, self.num_tokens, self.blocks = proposer, num_tokens, blocks
        self.max_model_len = max_model_len
        self.held: dict[int, int] = {}  # request id -> blocks it held before this step's draft
        # request id -> (position of its first draft token, the draft, its q): the drafts of
        # sampled rows that came with distributions, for ``verify``.
        self.q: dict[int, tuple[int, list[int], torch.Tensor]] = {}

    def attach(self, runner: Runner) -> None:
        """Hand the proposer the engine's runner, and make this drafter the runner's draft
        verifier (a runner without one, a fake or simulated one, verifies by draw and
        compare only, which is all a point-mass draft needs)."""
        if hasattr(self.proposer, "attach"):  # optional: a proposer that runs no model has none
            self.proposer.attach(runner)
        install = getattr(runner, "set_draft_verifier", None)
        if install is not None:
            install(self)

    def draft(self, plan: StepPlan, requests: dict[int, Request], budget: int) -> None:
        """Lengthen each decode row by its draft, out of what is left of the token
        budget and of the unkeyed free blocks, so that a draft never preempts, evicts or
        delays anyone. The proposer is asked once, for every row, each within the whole
        budget; the drafts then take the budget in the plan's order, and one that the rows
        before it left less room is trimmed (so a row that drafts nothing leaves its share
        to the next)."""
        self.held.clear()
        running = {rid for rid, req in requests.items() if req.status == RequestStatus.RUNNING}
        if hasattr(self.proposer, "retain"):  # optional: what a request that left held
            self.proposer.retain(running)
        self.q = {rid: entry for rid, entry in self.q.items() if rid in running}
        if budget == 0:
            return
        asks: list[_Ask] = []
        for row in plan.scheduled:
            if row.phase == DECODE:
                ask = self._ask(row, requests[row.request_id], budget)
                if ask.request.max_tokens > ask.guessing:  # room for one draft token at least
                    asks.append(ask)
        if not asks:
            return
        drafts = self.proposer.propose([ask.request for ask in asks])
        for ask, draft in zip(asks, drafts, strict=True):
            if budget == 0:
                break
            if draft is not None and ask.guessing:
                draft = draft.cut(1)
            if draft is not None and draft.tokens:
                budget -= self._fit(plan, ask, draft, budget)

    def _ask(self, row: ScheduledRequest, req: Request, budget: int) -> _Ask:
        limits = {
            "the token budget": budget,
            "max_tokens": req.params.max_tokens - len(req.output_token_ids) - 1,
            "the context": self.max_model_len - req.num_tokens - 1,
        }
        room = min(self.num_tokens, *limits.values())
        # Overlap scheduling (minicb/overlap/bookkeeping.py): the last token may still be a
        # placeholder (negative: never a token id), computed by the plan in flight. The
        # lookup then ends at the token before it and proposes one more, whose first token
        # guesses the placeholder (never fed: the real token is) and the rest are the draft.
        # A wrong guess costs rejected drafts, never a wrong token: acceptance checks every
        # draft against the model's own choice after the real token.
        tokens = req.all_token_ids
        guessing = tokens[-1] < 0
        known = tokens[:-1] if guessing else tokens
        request = DraftRequest(req.request_id, known, room + guessing, req.params)
        return _Ask(row, limits, guessing, request)

    def _fit(self, plan: StepPlan, ask: _Ask, draft: Draft, budget: int) -> int:
        """Give one row as much of its draft as ``budget`` and the free blocks hold, say
        why, and return the tokens added."""
        ask.limits["the token budget"] = budget  # what the rows before it left
        room = min(self.num_tokens, *ask.limits.values())
        draft = draft.cut(0, room)
        rid, row = ask.request.request_id, ask.row
        slots = self.blocks.spare_slots(rid, row.context_len)
        d = min(len(draft.tokens), slots)
        if d:
            self.held[rid] = len(self.blocks.block_table(rid))
            self.blocks.allocate_slots(rid, row.context_len + d)
            extend_row(row, draft.tokens[:d], self.blocks.block_table(rid))
            if draft.q is not None and not (row.params is None or row.params.greedy):
                self.q[rid] = (row.context_len - d, draft.tokens[:d], draft.q[:d])
        limit = None
        if room < self.num_tokens and len(draft.tokens) == room:
            binding = next(k for k, v in ask.limits.items() if v == room)
            limit = f"{binding} leaves room for {room}"
        plan.drafted.append(Decision(rid, draft_reason(draft, d, slots, limit)))
        return d

    def verify(
        self, row: ScheduledRequest, logits: torch.Tensor, generator: torch.Generator
    ) -> list[int] | None:
        """The runner's side (``DraftVerifier``, hooks.py): the tokens of a drafted row
        whose draft came with distributions, by rejection sampling on the row's logits
        (1 + d, vocab): the kept guesses, then the residual's draw or the bonus. None for a
        row whose draft is a point mass: the runner draws at each position as for any row,
        and ``accept`` keeps the matching prefix."""
        entry = self.q.get(row.request_id)
        d = row.num_draft_tokens
        if entry is None or entry[0] != row.context_len - d or entry[1] != row.token_ids[-d:]:
            return None
        from minicb.speculation.rejection import verify_row  # torch: only for such a row

        return verify_row(entry[1], entry[2], logits, row.params, row.num_output_tokens, generator)

    def accept(self, row: ScheduledRequest, sampled: list[int]) -> list[int]:
        """What a verified row keeps: the prefix of its draft that ``sampled`` repeats, then
        the next token (after ``verify``, ``sampled`` is already that: its kept guesses and
        one token drawn from the residual never equal to the rejected guess, or the bonus)."""
        return accept_greedy(row.token_ids[-row.num_draft_tokens :], sampled)

    def settle(self, row: ScheduledRequest, req: Request, kept: int) -> None:
        """Count the guesses kept, then give back the blocks taken only for guesses the
        model rejected, keeping what the request's tokens need and what it held before (a
        reservation made at admission stays whole)."""
        self.q.pop(req.request_id, None)
        row.num_accepted_tokens = kept - 1
        req.metrics.num_draft_tokens += row.num_draft_tokens
        req.metrics.num_accepted_tokens += kept - 1
        need = blocks_needed(req.num_tokens, self.blocks.block_size)
        self.blocks.trim(req.request_id, max(need, self.held.pop(req.request_id, 0)))


def extend_row(row: ScheduledRequest, draft: list[int], block_table: list[int]) -> None:
    """A decode row that also feeds ``draft``: a query of 1 + d tokens at the end of the
    context, sampled at every position."""
    row.num_tokens += len(draft)
    row.context_len += len(draft)
    row.num_draft_tokens = len(draft)
    row.token_ids = row.token_ids + draft
    row.block_table = list(block_table)
    row.num_blocks = len(block_table)
