"""Overlap scheduling's bookkeeping: a plan counted as run before its tokens are known.

With ``overlap_scheduling`` the engine plans iteration N+1 while the runner still computes
iteration N (minicb/overlap/pipeline.py). The scheduler plans from its requests' counters, so
before N+1 is planned every row of N is *advanced* as if it had run: its tokens count as
computed, and a row that samples gets a ``PLACEHOLDER`` token at the end of its request's
output. N+1's decode rows then carry that placeholder as their input token; the engine
writes N's real token into them before N+1 runs. When N's tokens arrive they are
*settled*: each placeholder becomes the real token, is detokenized and checked for a stop,
and only then are the blocks N filled keyed for the prefix cache (a block is keyed once
its KV is written, as without overlap).

A request that stops at N is learnt to have stopped only after N+1 was planned: its row in
N+1 runs (its KV write is harmless: the position is its own, past every keyed block) but
is *discarded*: never advanced, its token never settled, and its blocks are freed with it.

Speculative decoding: a row that verifies drafts yields 1 to 1 + d tokens, and how many
decides where its request's next row starts, so no placeholder can stand for them. Such a
row is not advanced; the engine waits for its plan before planning the next one (it
*settles* the row as ``Scheduler.update`` does), so nothing is ever planned on a guessed
count. Drafts themselves may still be proposed under a placeholder: the proposer guesses
it (minicb/speculation/ngram.py), and acceptance keeps the tokens exact.
Pure Python, as the rest of the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable

from minicb.core.request import Request
from minicb.core.scheduler.base import SchedulerBase
from minicb.core.scheduler.plan import PADDING, StepPlan

PLACEHOLDER = -1  # not a token id: a row that still holds one must never reach a model


def advance(scheduler: SchedulerBase, plan: StepPlan) -> set[int]:
    """Count ``plan``'s rows as run (their tokens computed, a placeholder for each sampled
    token) so that the next plan can be made now. Returns the ids of the rows discarded:
    their requests stopped (or left) after this plan was made."""
    discarded = set()
    for row in plan.scheduled:
        if row.phase == PADDING:
            continue
        req = scheduler.requests.get(row.request_id)
        if req is None or req.finished:
            discarded.add(row.request_id)
            continue
        if row.num_draft_tokens:  # 1 to 1 + d tokens: counted when known (verifies_drafts)
            continue
        # As SchedulerBase.update with one token kept.
        req.num_computed_tokens += row.num_tokens
        if row.samples:
            req.output_token_ids.append(PLACEHOLDER)
    if discarded:
        plan.notes.append(
            f"{len(discarded)} row(s) computed and discarded: request(s) "
            f"{', '.join(map(str, sorted(discarded)))} had stopped in the previous iteration, "
            f"learnt after this plan was made (overlap scheduling)"
        )
    return discarded


def settle(
    scheduler: SchedulerBase,
    plan: StepPlan,
    sampled: dict[int, int | list[int]],
    discarded: set[int],
    on_token: Callable[[Request], bool],
) -> None:
    """``plan`` has run: its placeholders become the sampled tokens, each one announced
    with ``on_token`` (which stops its request if it must), and the blocks it filled are
    keyed. A request that stops here while the next plan preempted it rejoins the batch,
    stopped, so that ``retire`` lets it go like any other."""
    for row in plan.scheduled:
        if row.phase == PADDING or row.request_id in discarded:
            continue
        req = scheduler.requests.get(row.request_id)
        if req is None:  # aborted while the step ran
            continue
        if row.num_draft_tokens:  # never advanced: settled as without overlap, in turn
            one_row = StepPlan(plan.step, plan.batching, plan.block_size)
            one_row.scheduled.append(row)
            scheduler.update(one_row, sampled, on_token)
            continue
        if row.request_id in scheduler.blocks.block_tables:  # not preempted since
            scheduler.blocks.commit(
                req.request_id, req.num_computed_tokens, req.token_slice, req.params.cache_salt
            )
        if not row.samples:
            continue
        token = sampled[row.request_id]
        req.output_token_ids[row.num_output_tokens] = token[0] if isinstance(token, list) else token
        req.metrics.num_generated_tokens = len(req.output_token_ids)
        if on_token(req) and req not in scheduler.running:
            _rejoin_stopped(scheduler, req)


def verifies_drafts(plan: StepPlan) -> bool:
    """Whether ``plan`` has a row whose number of tokens is known only once it has run: the
    next plan must wait for it."""
    return any(row.num_draft_tokens for row in plan.scheduled)


def _rejoin_stopped(scheduler: SchedulerBase, req: Request) -> None:
    """Preempted by the plan made while its stopping step ran: back in the batch, stopped."""
    for queue in (scheduler.waiting, scheduler.swapped):
        if req in queue:
            queue.remove(req)
    scheduler.running.append(req)


def forget(scheduler: SchedulerBase, plan: StepPlan, discarded: set[int]) -> None:
    """``plan`` failed to run: take its placeholders back out of its requests' outputs (the
    scheduler's ``undo`` then makes them wait again, their real tokens kept)."""
    for row in plan.scheduled:
        skip = row.phase == PADDING or not row.samples or row.num_draft_tokens
        if skip or row.request_id in discarded:
            continue
        req = scheduler.requests.get(row.request_id)
        if req is not None and req.output_token_ids[-1:] == [PLACEHOLDER]:
            req.output_token_ids.pop()
