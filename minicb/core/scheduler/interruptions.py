"""Interruptions: requests taken out of the schedule outside the step's own course.

Two things interrupt a request between steps. A client leaves (``abort``): the request is
removed wherever it is and its blocks are freed at once; the next plan reports it among
its finished. A step fails (``undo``): the runner raised while executing a plan, so every
request that plan touched may have half its KV written and none of its copies made; each
waits again with its blocks freed and its tokens kept, as after a preemption by
recompute, and a retry reads only KV that was written. Neither happens on the path of a
request that runs to its end, which is why they are here and not in base.py.

A mixin: ``SchedulerBase`` (base.py) inherits it, and these methods work on its state:
``requests``, the ``waiting``, ``running`` and ``swapped`` queues, ``blocks``,
``_pending_finished`` and its ``_release``. Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minicb.core.request import RequestStatus
from minicb.core.scheduler.plan import PADDING, Decision

if TYPE_CHECKING:
    from minicb.core.request import Request
    from minicb.core.scheduler.block_manager import BlockManager
    from minicb.core.scheduler.plan import StepPlan


class Interruptions:
    """SchedulerBase's ways out of the step's course: an abort, a failed step undone."""

    requests: dict[int, Request]
    waiting: list[Request]
    running: list[Request]
    swapped: list[Request]
    blocks: BlockManager
    _pending_finished: list[Decision]

    def undo(self, plan: StepPlan) -> list[int]:
        """After ``plan`` failed to run: every request it touched (a row, a swap in or out)
        waits again, its device and swap blocks freed and its tokens kept, to be computed
        again when admitted (its KV may be half written, its copies never made). Nothing
        else changed, so a retry reads only KV that was written. Returns their ids."""
        touched = [r.request_id for r in plan.scheduled if r.phase != PADDING]
        touched += [d.request_id for d in plan.swapped_in + plan.swapped_out]
        undone: list[int] = []
        for rid in dict.fromkeys(touched):
            req = self.requests.get(rid)
            if req is None or req.finished:
                continue
            for queue in (self.running, self.swapped, self.waiting):
                if req in queue:
                    queue.remove(req)
            self.blocks.free(rid)
            req.num_computed_tokens = 0
            req.status = RequestStatus.WAITING
            self.waiting.insert(len(undone), req)  # first, in the plan's order
            undone.append(rid)
        # Nor were the host tier's copies made: the blocks they were to fill hold nothing.
        self.blocks.forget_copies(plan.offload_map, plan.reload_map)
        return undone

    def abort(self, request_id: int) -> Request | None:
        """Remove a request wherever it is and free its blocks at once."""
        req = self.requests.get(request_id)
        if req is None or req.finished and req not in self.running:
            return None
        for queue in (self.waiting, self.running, self.swapped):
            if req in queue:
                queue.remove(req)
        req.status = RequestStatus.FINISHED_ABORTED
        self._release(req)
        self._pending_finished.append(Decision(request_id, "aborted by the client"))
        return req
