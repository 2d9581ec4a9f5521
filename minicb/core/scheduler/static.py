"""Static batching, the baseline: a batch forms only when the previous one has ended.

Nobody joins mid-batch. Each member reserves KV blocks for its whole prompt plus
``max_tokens`` up front (the worst-case reservation a server without paging must make,
so it never needs preemption; ``kv_reservation`` is a continuous-batching setting).
Prompts are prefilled first (in chunks if they exceed the token budget), then all members
decode in lockstep; a member that has stopped keeps its slot as a padding row that is
really computed, as in a padded ``generate``, until the longest member ends. Only then do
the members leave and their blocks return.

With ``static_order="length"`` a new batch is drawn from the queue sorted by ``max_tokens``,
shortest first (the policy's order breaks ties): the static baseline given its best chance.
The padding here is all in the lockstep decode (prompts are packed, not padded), so it is
the spread of output lengths within a batch that costs, and ``max_tokens`` is what a server
knows of them before generating: with ``ignore_eos`` the exact length, without it a bound.
(Sorting on prompt + ``max_tokens`` was measured too: where prompt and output lengths are
independent it groups outputs loosely and gains little; docs/performance.md.) Shortest first
because any order of the sorted list groups lengths equally well, and shortest-job-first
finishes the most requests soonest (lower mean latency); the price is that under a steady
stream of short requests a long one can wait indefinitely, which is why sorting suits an
offline batch, where the whole queue is known, and not a live server.
"""

from __future__ import annotations

from minicb.core.request import Request
from minicb.core.scheduler.base import SchedulerBase
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.core.scheduler.plan import PADDING, Decision, ScheduledRequest, StepPlan


class StaticScheduler(SchedulerBase):
    mode = "static"

    def _fill(self, plan: StepPlan) -> None:
        if not self.running:
            self._form_batch(plan)
        elif self.waiting:
            plan.notes.append(
                f"{len(self.waiting)} waiting: a static batch admits nobody until all its "
                f"{len(self.running)} members finish"
            )
        unprefilled = [r for r in self.running if not r.output_token_ids and not r.finished]
        if unprefilled:
            budget = self.config.max_num_batched_tokens
            for req in unprefilled:
                if budget == 0:
                    break
                n = min(req.num_uncomputed_tokens, budget)
                plan.scheduled.append(self._row(req, n))
                budget -= n
            return
        for req in self.running:
            row = self._padding_row(req) if req.finished else self._row(req, 1)
            plan.scheduled.append(row)
        if self.drafter is not None:  # drafts fit in the reserved blocks: only budget limits
            self._draft(plan, self._budget_left(plan))

    def _padding_row(self, req: Request) -> ScheduledRequest:
        """A finished static-batch member's row: recompute its last token, keep nothing."""
        last = req.num_computed_tokens - 1
        return ScheduledRequest(
            request_id=req.request_id,
            phase=PADDING,
            num_tokens=1,
            start_position=last,
            context_len=last + 1,
            block_table=list(self.blocks.block_table(req.request_id)),
            num_blocks=len(self.blocks.block_table(req.request_id)),
            store_kv=False,
            samples=False,
            token_ids=[req.all_token_ids[last]],
            params=req.params,
            num_output_tokens=len(req.output_token_ids),
        )

    def _budget_left(self, plan: StepPlan) -> int:
        return max(0, self.config.max_num_batched_tokens - plan.num_tokens)

    def _form_batch(self, plan: StepPlan) -> None:
        size = min(self.config.max_num_seqs, self.config.max_num_batched_tokens)
        queue = self.ordered(self.waiting)
        if self.config.static_order == "length":  # a stable sort: ties keep the policy's order
            queue.sort(key=lambda r: r.params.max_tokens)
        for req in queue:
            if len(self.running) >= size:
                plan.notes.append(f"static batch full at {size} requests")
                break
            reserve = min(req.max_total_tokens, self.max_model_len)
            need = blocks_needed(reserve, self.config.block_size)
            if self.blocks.allocate_slots(req.request_id, reserve) is None:
                plan.notes.append(
                    f"static batch closed: request {req.request_id} would reserve {need} blocks, "
                    f"{self.blocks.num_free_blocks} free"
                )
                break
            self._start_running(req, self.waiting)
            plan.admitted.append(
                Decision(
                    req.request_id,
                    f"admitted to a new static batch: reserves {need} blocks for prompt "
                    f"{req.num_prompt_tokens} + max_tokens {req.params.max_tokens}",
                )
            )

    def retire(self, plan: StepPlan) -> list[Request]:
        plan.finished.extend(self.interruptions.take_aborted())
        done: list[Request] = []
        if self.running and all(r.finished for r in self.running):
            done, self.running = self.running, []
            for req in done:
                self._release(req)
                plan.finished.append(
                    Decision(
                        req.request_id, f"finished ({req.finish_reason}); its static batch ended"
                    )
                )
        self._record_kv(plan)
        return done
