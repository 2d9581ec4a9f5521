"""Interruptions: requests taken out of the schedule outside the step's own course.

Two things interrupt a request between steps. A client leaves (``abort``): the request is
removed wherever it is and its blocks are freed at once; the next plan reports it among
its finished. A step fails (``undo``): the runner raised while executing a plan, so every
request that plan touched may have half its KV written and none of its copies made; each
waits again with its blocks freed and its tokens kept, as after a preemption by
recompute, and a retry reads only KV that was written. Neither happens on the path of a
request that runs to its end, which is why they are here and not in base.py.

A collaborator: each scheduler (base.py) holds one ``Interruptions`` built with itself and
answers ``abort`` and ``undo`` with it. It works on the scheduler's queues through the
scheduler, never through copies of them (a static batch replaces its running list), and
keeps one thing of its own: the aborts not yet reported in a plan. Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minicb.core.request import RequestStatus
from minicb.core.scheduler.plan import PADDING, Decision

if TYPE_CHECKING:
    from minicb.core.request import Request
    from minicb.core.scheduler.base import SchedulerBase
    from minicb.core.scheduler.plan import StepPlan


class Interruptions:
    """One scheduler's ways out of the step's course: an abort, a failed step undone."""

    def __init__(self, scheduler: SchedulerBase) -> None:
        self.scheduler = scheduler
        # Aborts are made between steps and reported in the next plan's finished.
        self.aborted: list[Decision] = []

    def take_aborted(self) -> list[Decision]:
        """The aborts since the last plan was retired, once: the next retire reports them."""
        aborted, self.aborted = self.aborted, []
        return aborted

    def undo(self, plan: StepPlan) -> list[int]:
        """After ``plan`` failed to run: every request it touched (a row, a swap in or out)
        waits again, its device and swap blocks freed and its tokens kept, to be computed
        again when admitted (its KV may be half written, its copies never made). Nothing
        else changed, so a retry reads only KV that was written. Returns their ids."""
        s = self.scheduler
        touched = [r.request_id for r in plan.scheduled if r.phase != PADDING]
        touched += [d.request_id for d in plan.swapped_in + plan.swapped_out]
        undone: list[int] = []
        for rid in dict.fromkeys(touched):
            req = s.requests.get(rid)
            if req is None or req.finished:
                continue
            for queue in (s.running, s.swapped, s.waiting):
                if req in queue:
                    queue.remove(req)
            s.blocks.free(rid)
            req.num_computed_tokens = 0
            req.status = RequestStatus.WAITING
            s.waiting.insert(len(undone), req)  # first, in the plan's order
            undone.append(rid)
        # Nor were the host tier's copies made: the blocks they were to fill hold nothing.
        s.blocks.forget_copies(plan.offload_map, plan.reload_map)
        return undone

    def abort(self, request_id: int) -> Request | None:
        """Remove a request wherever it is and free its blocks at once."""
        s = self.scheduler
        req = s.requests.get(request_id)
        if req is None or req.finished and req not in s.running:
            return None
        for queue in (s.waiting, s.running, s.swapped):
            if req in queue:
                queue.remove(req)
        req.status = RequestStatus.FINISHED_ABORTED
        s._release(req)  # the scheduler's own leaving: a subclass may keep the KV (fleet)
        self.aborted.append(Decision(request_id, "aborted by the client"))
        return req
