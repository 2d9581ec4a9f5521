"""Speculative decoding's proposer: guess a request's next tokens cheaply, let the model check.

A decode row normally brings one token (the last one generated) and gets one new token back.
With a draft of ``d`` guessed tokens it brings ``1 + d``, the runner samples at every one of
those positions in the same ragged forward pass as everyone else's work (a query of
``1 + d`` tokens at the end of the context: the chunked-prefill attention path), and greedy
acceptance keeps the longest prefix of the draft that equals the model's own greedy choices,
plus the model's token after it (the "bonus"): between 1 and ``1 + d`` tokens per step, and
exactly the tokens the model would have produced one step at a time.

The proposer here is **n-gram prompt lookup** (no second model): take the last ``n`` tokens
(``ngram_max`` down to ``ngram_min``), find where they occurred before in the request's own
prompt or output (the longest such suffix; among its occurrences, the one followed by the
most tokens, then the most recent), and propose the tokens that followed them there. It
shines when the output copies its input (rewriting or editing code or text given in the
prompt) and costs little when it finds nothing.

Any object with ``propose(token_ids, max_tokens) -> Draft | None`` can stand in for it
(the ``Proposer`` protocol): a draft-model proposer would run a small model over the
request's tokens and return its greedy continuation (docs/speculative.md says how). Only
greedy requests draft: for a request that samples, drafts would need rejection sampling to
keep its distribution exact, and its seeded tokens reproducible; minicb gives it none.

Pure Python, no torch: the scheduler calls the proposer while it builds the StepPlan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from minicb.core.config import EngineConfig
from minicb.core.scheduler.block_manager import BlockManager, blocks_needed
from minicb.core.scheduler.plan import DECODE, Decision, ScheduledRequest, StepPlan

if TYPE_CHECKING:
    from minicb.core.request import Request


@dataclass(frozen=True)
class Draft:
    """Guessed next tokens of one request, and where the guess came from."""

    tokens: list[int]  # the proposed continuation, at most the max_tokens asked for
    ngram: list[int]  # the suffix that was matched (empty for a proposer without one)
    position: int  # where that suffix appeared before, as an index into the request's tokens


class Proposer(Protocol):
    def propose(self, token_ids: Sequence[int], max_tokens: int) -> Draft | None:
        """Up to ``max_tokens`` guesses of what follows ``token_ids`` (prompt + output so
        far), or None when there is no guess worth checking."""
        ...


class NgramProposer:
    """Prompt lookup: the tokens that followed the last occurrence of the longest suffix of
    ``min_n`` to ``max_n`` tokens that has occurred before."""

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> Draft | None:
        n = len(token_ids)
        if max_tokens < 1 or n <= self.min_n:
            return None
        # Best: the longest match, then the longest continuation (capped at max_tokens: the
        # latest occurrence of a repeated run is followed by one token only), then the latest.
        best, best_end = (0, 0), -1
        for end in self._earlier(token_ids, token_ids[-1]):  # most recent first
            length = 1
            while (
                length < self.max_n
                and length <= end
                and token_ids[end - length] == token_ids[n - 1 - length]
            ):
                length += 1
            score = (length, min(n - 1 - end, max_tokens))
            if score > best:
                best, best_end = score, end
                if score == (self.max_n, max_tokens):
                    break
        length = best[0]
        if length < self.min_n:
            return None
        start = best_end - length + 1
        tokens = list(token_ids[best_end + 1 : best_end + 1 + max_tokens])
        return Draft(tokens, list(token_ids[start : best_end + 1]), start)

    @staticmethod
    def _earlier(token_ids: Sequence[int], token: int) -> list[int]:
        """Positions before the last one that hold ``token``, latest first (list.index
        scans in C, much faster than a Python loop over a long prompt)."""
        found, i, stop = [], -1, len(token_ids) - 1
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        while True:
            try:
                i = ids.index(token, i + 1, stop)
            except ValueError:
                return found[::-1]
            found.append(i)


def accept_greedy(draft: Sequence[int], verified: Sequence[int]) -> list[int]:
    """The tokens a verified row yields: ``verified[i]`` is the model's greedy token after
    the row's ``i``-th input (``i = 0``: after the last real token; ``i > 0``: after draft
    token ``i - 1``). Keep the model's tokens while the draft agreed with them, then the
    first one where it did not (or the bonus token after a fully accepted draft)."""
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
    )
    if num_drafted == 0:
        return f"drafts nothing: {found}, but no free KV block is left for drafts"
    words = f"drafts {num_drafted} token{'s' if num_drafted > 1 else ''}: {found}"
    if num_drafted < len(draft.tokens):
        return words + f"; trimmed from {len(draft.tokens)}: the free KV blocks hold {slots} more"
    return words + (f"; {limit}" if limit else "")


class Drafter:
    """Adds drafts to a plan's greedy decode rows, within what nobody else needs: the
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

    def add_drafts(self, plan: StepPlan, requests: dict[int, Request], budget: int) -> int:
        """Lengthen each greedy decode row by its draft, out of what is left of the token
        budget and of the unkeyed free blocks, so that a draft never preempts, evicts or
        delays anyone; returns the budget left."""
        self.held.clear()
        for row in plan.scheduled:
            if budget == 0:
                break
            req = requests[row.request_id]
            if row.phase == DECODE and req.params.greedy:
                budget -= self._draft(plan, row, req, budget)
        return budget

    def _draft(self, plan: StepPlan, row: ScheduledRequest, req: Request, budget: int) -> int:
        """Draft for one row; returns the tokens added."""
        limits = {
            "the token budget": budget,
            "max_tokens": req.params.max_tokens - len(req.output_token_ids) - 1,
            "the context": self.max_model_len - req.num_tokens - 1,
        }
        room = min(self.num_tokens, *limits.values())
        tokens = req.all_token_ids
        # Overlap scheduling (minicb/overlap/bookkeeping.py): the last token may still be a
        # placeholder (negative: never a token id), computed by the plan in flight. The
        # lookup then ends at the token before it and proposes one more, whose first token
        # guesses the placeholder (never fed: the real token is) and the rest are the draft.
        # A wrong guess costs rejected drafts, never a wrong token: acceptance checks every
        # draft against the model's own choice after the real token.
        guessing = tokens[-1] < 0
        draft = None
        if room > 0:
            draft = self.proposer.propose(tokens[:-1] if guessing else tokens, room + guessing)
        if draft is not None and guessing:
            draft = Draft(draft.tokens[1:], draft.ngram, draft.position)
        if draft is None or not draft.tokens:
            return 0
        slots = self.blocks.spare_slots(req.request_id, row.context_len)
        d = min(len(draft.tokens), slots)
        if d:
            self.held[req.request_id] = len(self.blocks.block_table(req.request_id))
            self.blocks.allocate_slots(req.request_id, row.context_len + d)
            extend_row(row, draft.tokens[:d], self.blocks.block_table(req.request_id))
        limit = None
        if room < self.num_tokens and len(draft.tokens) == room:
            binding = next(k for k, v in limits.items() if v == room)
            limit = f"{binding} leaves room for {room}"
        reason = draft_reason(draft, d, slots, limit)
        plan.drafted.append(Decision(req.request_id, reason))
        return d

    def roll_back(self, req: Request) -> None:
        """After the step: give back the blocks taken only for guesses the model rejected,
        keeping what the request's tokens need and what it held before (a reservation made
        at admission stays whole)."""
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


def make_drafter(config: EngineConfig, blocks: BlockManager, max_model_len: int) -> Drafter | None:
    """The drafter ``config.speculative`` asks for, or None when speculation is off."""
    if config.speculative == "ngram":
        proposer = NgramProposer(config.ngram_min, config.ngram_max)
        return Drafter(proposer, config.num_speculative_tokens, blocks, max_model_len)
    return None
