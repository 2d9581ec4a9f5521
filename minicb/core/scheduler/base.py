"""What every scheduler shares: the queues, admission checks, token bookkeeping and the
ordering policies (an abort, and a failed step undone, are its collaborator's:
interruptions.py).

A scheduler owns the requests and the BlockManager. Each iteration the engine calls
``schedule()`` for a StepPlan, runs it, then ``update()`` with the sampled tokens, marks
stops with ``finish()``, and calls ``retire()`` to let finished requests leave.

Ordering policies give a sort key where smaller means "serve sooner"; the preemption
victim is the request with the largest key.

- ``fcfs``: first come, first served, by arrival.
- ``priority``: a request's ``priority`` (lower is more urgent, as in vLLM), improved by
  one level every ``aging_steps`` iterations since it arrived, so a low-priority request
  cannot wait forever: after ``(p - p_best + 1) * aging_steps`` iterations it outranks
  every newcomer.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

from minicb.core.config import EngineConfig
from minicb.core.request import Request, RequestStatus
from minicb.core.scheduler.block_manager import BlockManager, blocks_needed
from minicb.core.scheduler.hooks import make_drafter
from minicb.core.scheduler.interruptions import Interruptions
from minicb.core.scheduler.plan import (
    DECODE,
    PADDING,
    PREFILL,
    Decision,
    ScheduledRequest,
    StepPlan,
)

# A policy is the order of a queue at a step: given the step, the key that sorts requests.
# FCFS's key never changes and is read in C (an attrgetter): a queue of thousands is sorted
# every step, and a Python key per request took a fifth of a 4,000-request simulated run.
SortKey = Callable[[Request], tuple]
Policy = Callable[[int], SortKey]

FCFS_ORDER: SortKey = attrgetter("arrival_time", "request_id")


def fcfs(step: int) -> SortKey:
    return FCFS_ORDER


def make_priority(aging_steps: int) -> Policy:
    def priority(step: int) -> SortKey:
        def key(req: Request) -> tuple:
            age = max(0, step - req.arrival_step)
            return (req.priority - age // aging_steps, req.arrival_time, req.request_id)

        return key

    return priority


def get_policy(name: str, aging_steps: int) -> Policy:
    if name == "fcfs":
        return fcfs
    if name == "priority":
        return make_priority(aging_steps)
    raise ValueError(f"unknown policy {name!r}; choose fcfs or priority")


class RequestRejected(ValueError):
    """A request that can never be served under the engine's limits."""


class SchedulerBase:
    mode = "base"
    shares_prefixes = False  # whether enable_prefix_caching applies to this batching mode

    def __init__(
        self,
        config: EngineConfig,
        num_kv_blocks: int,
        max_model_len: int,
        num_swap_blocks: int | None = None,
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len
        num_swap = num_swap_blocks if num_swap_blocks is not None else config.num_swap_blocks
        num_swap = num_kv_blocks if num_swap is None else num_swap
        caching = config.enable_prefix_caching and self.shares_prefixes
        # A lower tier of the prefix cache, if a feature's record asks for one (seam 2).
        tier_blocks = config.answer("cache tier blocks", 0)
        self.blocks = BlockManager(num_kv_blocks, config.block_size, num_swap, caching, tier_blocks)
        self.policy = get_policy(config.policy, config.aging_steps)
        # None when speculation is off; else it adds drafts to the decode rows of a plan
        # and says which were kept (the hooks of seam 1, hooks.py).
        self.drafter = make_drafter(config, self.blocks, max_model_len)
        self.proposer = config.answer("drafter", None) if self.drafter is not None else None
        self.requests: dict[int, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.step_count = 0
        self.num_ended = 0  # requests that left, finished or aborted: a count, kept for a view
        # Aborts and failed steps undone, between iterations (interruptions.py).
        self.interruptions = Interruptions(self)

    # ---- admission ---------------------------------------------------------------------
    def check_request(self, req: Request) -> None:
        """Raise RequestRejected, naming the limit, if ``req`` could never be served."""
        n_prompt = req.num_prompt_tokens
        if n_prompt == 0:
            raise RequestRejected("the prompt is empty; give at least one token")
        if n_prompt >= self.max_model_len:
            raise RequestRejected(
                f"prompt of {n_prompt} tokens does not fit the model's context of "
                f"{self.max_model_len} tokens (it needs room for at least one new token)"
            )
        worst = min(req.max_total_tokens, self.max_model_len)
        pool_tokens = self.blocks.num_blocks * self.config.block_size
        if blocks_needed(worst, self.config.block_size) > self.blocks.num_blocks:
            raise RequestRejected(
                f"request needs up to {worst} tokens of KV cache (prompt {n_prompt} + max_tokens "
                f"{req.params.max_tokens}) but the whole pool holds {pool_tokens} "
                f"({self.blocks.num_blocks} blocks of {self.config.block_size})"
            )
        if not self.config.enable_chunked_prefill and worst > self.config.max_num_batched_tokens:
            raise RequestRejected(
                f"without chunked prefill a request must fit one iteration's token budget: "
                f"prompt {n_prompt} + max_tokens {req.params.max_tokens} exceeds "
                f"max_num_batched_tokens={self.config.max_num_batched_tokens}"
            )

    def add(self, req: Request) -> None:
        self.check_request(req)
        req.arrival_step = self.step_count
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def queue_sizes(self) -> dict[str, int]:
        """Requests waiting, running (holding a batch slot) and swapped out: a router's load."""
        waiting, running, swapped = len(self.waiting), len(self.running), len(self.swapped)
        return {"waiting": waiting, "running": running, "swapped": swapped}

    # ---- the iteration -------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        self.step_count += 1
        plan = StepPlan(self.step_count, self.mode, self.config.block_size)
        plan.budget_limit = self.config.max_num_batched_tokens
        plan.slots_limit = self.config.max_num_seqs
        self._fill(plan)
        plan.offload_map, plan.reload_map = self.blocks.take_copies()
        plan.budget_used = plan.num_tokens
        plan.slots_used = len(self.running)
        return plan  # the pool's figures and block maps are recorded by retire(), after the step

    def _fill(self, plan: StepPlan) -> None:
        raise NotImplementedError

    def update(
        self,
        plan: StepPlan,
        sampled: dict[int, int | list[int]],
        on_token: Callable[[Request], bool] | None = None,
    ) -> list[Request]:
        """Advance computed counts, append sampled tokens; return requests that got one.

        A row that verified drafts gets the tokens the drafter accepts, appended one at a
        time: ``on_token(req)`` is called after each, and True (the request stopped) ends
        that row's tokens there. Rejected drafts are dropped from the computed tokens; the
        drafter settles the rest (its counts, the blocks only rejected drafts needed)."""
        got_token = []
        for row in plan.scheduled:
            if row.phase == PADDING:
                continue
            req = self.requests[row.request_id]
            if not row.samples:
                req.num_computed_tokens += row.num_tokens
                self.blocks.commit(
                    req.request_id, req.num_computed_tokens, req.token_slice, req.params.cache_salt
                )
                continue
            tokens = self._accepted(row, sampled[row.request_id])
            kept = 0
            for token in tokens:
                req.output_token_ids.append(token)
                kept += 1
                if on_token is not None and on_token(req):
                    break
            req.metrics.num_generated_tokens = len(req.output_token_ids)
            # KV was written for all the row's tokens; of its drafts, the kept ones are valid.
            req.num_computed_tokens += row.num_tokens - row.num_draft_tokens + kept - 1
            self.blocks.commit(
                req.request_id, req.num_computed_tokens, req.token_slice, req.params.cache_salt
            )
            if row.num_draft_tokens:
                self.drafter.settle(row, req, kept)
            got_token.append(req)
        return got_token

    def _draft(self, plan: StepPlan, budget: int) -> None:
        """Let the drafter lengthen the plan's decode rows within ``budget``; a plan whose
        rows drafted names the proposer, for the step event (and what counts per proposer)."""
        assert self.drafter is not None
        self.drafter.draft(plan, self.requests, budget)
        if plan.num_draft_tokens:
            plan.proposer = self.proposer

    def _accepted(self, row: ScheduledRequest, sampled: int | list[int]) -> list[int]:
        """The new tokens of a sampling row: one, or what the drafter accepts of its drafts
        (a runner that did not verify them gives one token: no draft is accepted)."""
        verified = sampled if isinstance(sampled, list) else [sampled]
        if not row.num_draft_tokens:
            return verified[:1]
        return self.drafter.accept(row, verified)

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Mark a request stopped. It leaves the batch at ``retire()``."""
        req.status = status

    def retire(self, plan: StepPlan) -> list[Request]:
        """Release stopped requests; record them in ``plan.finished``; return them."""
        plan.finished.extend(self.interruptions.take_aborted())
        done = [r for r in self.running if r.finished]
        for req in done:
            self.running.remove(req)
            self._release(req)
            plan.finished.append(Decision(req.request_id, f"finished ({req.finish_reason})"))
        self._record_kv(plan)
        return done

    # ---- out of the step's course (interruptions.py) -------------------------------------
    def abort(self, request_id: int) -> Request | None:
        """A client leaves: the request goes wherever it is, its blocks freed at once."""
        return self.interruptions.abort(request_id)

    def undo(self, plan: StepPlan) -> list[int]:
        """``plan`` failed to run: its requests wait again, blocks freed, tokens kept."""
        return self.interruptions.undo(plan)

    def _release(self, req: Request) -> None:
        self.blocks.free(req.request_id)
        self.requests.pop(req.request_id, None)
        self.num_ended += 1

    # ---- helpers -------------------------------------------------------------------------
    def _record_kv(self, plan: StepPlan) -> None:
        plan.kv_used = self.blocks.num_used_blocks
        plan.kv_free = self.blocks.num_free_blocks
        plan.kv_total = self.blocks.num_blocks
        plan.kv_swapped = self.blocks.num_swapped_blocks
        plan.kv_cached = self.blocks.num_cached_blocks
        plan.kv_shared = self.blocks.num_shared_blocks
        plan.kv_host_cached = self.blocks.num_host_cached_blocks
        plan.num_waiting = len(self.waiting)
        plan.num_swapped = len(self.swapped)
        plan.kv_ops = self.blocks.take_changes()  # what changed, never the whole map

    def _row(self, req: Request, num_tokens: int) -> ScheduledRequest:
        """A prefill chunk or decode of ``num_tokens`` tokens from where the request stands."""
        start = req.num_computed_tokens
        end = start + num_tokens
        total = len(req.prompt_token_ids) + len(req.output_token_ids)  # once: on every row
        table = self.blocks.block_tables.get(req.request_id, ())
        # Positional, in the order of ScheduledRequest's fields: built for every running
        # request at every step, and a call with eleven keywords costs twice as much
        # (0.64 against 0.28 us; at 256 running, a sixth of schedule()).
        return ScheduledRequest(
            req.request_id,
            PREFILL if (total - start > 1 or start == 0) else DECODE,  # phase
            num_tokens,
            start,  # start_position
            end,  # context_len
            list(table),  # block_table
            len(table),  # num_blocks
            True,  # store_kv
            end == total,  # samples
            0,  # num_draft_tokens: the drafter adds them last
            0,  # num_accepted_tokens: known after the step
            req.token_slice(start, end),  # token_ids
            req.params,
            len(req.output_token_ids),  # num_output_tokens
        )

    def _start_running(self, req: Request, source: list[Request]) -> None:
        """Move ``req`` from ``source`` (waiting or swapped) into the running batch."""
        source.remove(req)
        self.running.append(req)
        req.status = RequestStatus.RUNNING

    def ordered(self, queue: list[Request]) -> list[Request]:
        return sorted(queue, key=self.policy(self.step_count))
