"""Ordering policies: who is served first, and who is preempted first.

Both give a sort key where smaller means "serve sooner". The preemption victim is the
request with the largest key.

- ``fcfs``: first come, first served, by arrival.
- ``priority``: a request's ``priority`` (lower is more urgent, as in vLLM), improved by
  one level every ``aging_steps`` iterations since it arrived, so a low-priority request
  cannot wait forever: after ``(p - p_best + 1) * aging_steps`` iterations it outranks
  every newcomer.
"""

from __future__ import annotations

from collections.abc import Callable

from minicb.request import Request

SortKey = Callable[[Request, int], tuple]


def fcfs_key(req: Request, step: int) -> tuple:
    return (req.arrival_time, req.request_id)


def make_priority_key(aging_steps: int) -> SortKey:
    def priority_key(req: Request, step: int) -> tuple:
        age = max(0, step - req.arrival_step)
        return (req.priority - age // aging_steps, req.arrival_time, req.request_id)

    return priority_key


def get_policy(name: str, aging_steps: int) -> SortKey:
    if name == "fcfs":
        return fcfs_key
    if name == "priority":
        return make_priority_key(aging_steps)
    raise ValueError(f"unknown policy {name!r}; choose fcfs or priority")
