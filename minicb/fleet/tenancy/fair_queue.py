"""The fair queue: where requests wait for a replica, one FIFO queue per tenant.

An engine serves its waiting requests first come, first served, so a tenant that sends ten
times more fills the queue and everyone else waits behind it. The fair queue moves the
waiting in front of dispatch: requests are sent to the replicas only while one has room
(the caller's rule: a bound on the requests in flight per replica), so the replicas'
own queues stay short and WHO goes next is decided here, by two rules:

1. Priority bands. A lower ``priority`` value is a higher band (as the engine's own
   priority): a request of band 0 always goes before any of band 1. Strict, so a band
   can starve the ones below it; that is what a band is for (paid over free traffic).
2. Deficit round robin within a band (Shreedhar and Varghese, 1995; NVIDIA Dynamo's
   router queue counts in uncached tokens too). The tenants with requests queued take
   turns; each turn adds ``quantum`` to the tenant's deficit, and its head request goes
   if its cost fits the deficit (which is then charged), else the turn passes. Over time
   each busy tenant gets the same tokens of work, whatever its request sizes: a tenant
   of short prompts is not outrun by one of long prompts, nor by one that sends more.

A request's cost is the prefill it will cause, its uncached prompt tokens (uncached.py:
the prompt's length less what the router expects cached), because prefill is what makes
the others wait for their first token; but at least ``min_cost``, because every request
holds a slot and computes at least its last prompt token: a tenant whose prompts are all
cached would otherwise cost nothing, and its turn would never end. A tenant whose queue
empties forgets its deficit (it cannot save up turns while idle).

Two refusals at the door, each naming its limit (``Refused``): a tenant's queue is full
(``max_queued`` requests waiting), or its token bucket (token_bucket.py) is short (with
the seconds until it is not). Pure Python, no clock of its own: the caller says ``now``,
so the simulated fleet (virtual time) and the server (wall time) run the same queue.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from minicb.fleet.tenancy.tenant import DEFAULT_TENANT, Tenant
from minicb.fleet.tenancy.token_bucket import TokenBucket

QUANTUM = 512  # uncached prompt tokens a tenant's turn adds to its deficit
MIN_COST = 64  # what a request costs at least, however much of its prompt is cached
REFUSAL_REASONS = ("queue_full", "rate_limited", "too_large")


class Refused(Exception):
    """A request the fair queue will not hold: ``reason`` is "queue_full",
    "rate_limited" or "too_large"; ``retry_after_s``: when trying again may succeed (None:
    it never will)."""

    def __init__(self, reason: str, message: str, retry_after_s: int | None) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry_after_s = reason, message, retry_after_s


@dataclass(eq=False)
class Queued:
    """One waiting request: the caller's ``item`` and what the queue knows of it."""

    item: Any
    tenant: str
    cost: int  # uncached prompt tokens: what its turn charges
    asked: int  # prompt tokens + max_tokens: what its bucket was charged
    arrival: float


@dataclass(eq=False)
class Lane:
    """One tenant's queue, its deficit and its counts."""

    tenant: Tenant
    bucket: TokenBucket | None
    queue: deque[Queued] = field(default_factory=deque)
    deficit: int = 0
    fresh: bool = True  # its next look starts a new turn (adds the quantum)
    queued_tokens: int = 0
    dispatched: int = 0
    rejected: Counter[str] = field(default_factory=Counter)


class FairQueue:
    """Per-tenant FIFO queues, served by band then by deficit round robin (module doc).

    ``tenants``: the configured ones; a name not among them (a key with no settings of
    its own) gets ``default``'s settings under its own name, a lane of its own."""

    def __init__(
        self,
        tenants: Iterable[Tenant] = (),
        *,
        quantum: int = QUANTUM,
        min_cost: int = MIN_COST,
        default: Tenant | None = None,
    ) -> None:
        if quantum < 1:
            raise ValueError(f"the fair queue's quantum must be at least 1 token, got {quantum}")
        self.quantum, self.min_cost = quantum, min_cost
        self.default = default or Tenant(DEFAULT_TENANT)
        self.lanes: dict[str, Lane] = {}
        self._bands: dict[int, deque[Lane]] = {}  # band -> its lanes with requests, in turn
        for tenant in (self.default, *tenants):
            self.lanes[tenant.name] = self._lane(tenant)

    @staticmethod
    def _lane(tenant: Tenant) -> Lane:
        rate, burst = tenant.tokens_per_s, tenant.burst
        return Lane(tenant, None if rate is None or burst is None else TokenBucket(rate, burst))

    def lane(self, name: str) -> Lane:
        """The tenant's lane (a new one, with the default's settings, for a new name)."""
        lane = self.lanes.get(name)
        if lane is None:
            d = self.default
            lane = self._lane(Tenant(name, d.priority, d.tokens_per_s, d.burst_tokens,
                                     d.max_queued))  # fmt: skip
            self.lanes[name] = lane
        return lane

    def __len__(self) -> int:
        return sum(len(lane.queue) for lane in self.lanes.values())

    # ---- in: the door ------------------------------------------------------------------
    def push(self, item: Any, tenant: str, cost: int, asked: int, now: float) -> Queued:
        """Queue ``item`` for ``tenant``; Refused (counted) if its queue is full or its
        rate is spent. ``cost``: uncached prompt tokens (charged at least ``min_cost``);
        ``asked``: prompt + max_tokens."""
        lane = self.lane(tenant)
        t = lane.tenant
        if len(lane.queue) >= t.max_queued:
            lane.rejected["queue_full"] += 1
            raise Refused("queue_full", f"tenant {tenant!r} has {t.max_queued} requests "
                          f"queued, its limit (max_queued)", 1)  # fmt: skip
        if lane.bucket is not None:
            wait = lane.bucket.take(asked, now)
            if wait == math.inf:
                lane.rejected["too_large"] += 1
                raise Refused(
                    "too_large",
                    f"the request asks for {asked} tokens (prompt + "
                    f"max_tokens), more than tenant {tenant!r}'s burst of "
                    f"{lane.bucket.burst:.0f} at {t.tokens_per_s:g} tokens/s",
                    None,
                )
            if wait > 0:
                lane.rejected["rate_limited"] += 1
                raise Refused("rate_limited", f"tenant {tenant!r} is over its rate limit of "
                              f"{t.tokens_per_s:g} tokens/s (prompt + max_tokens; burst "
                              f"{lane.bucket.burst:.0f}); {asked} tokens asked",
                              max(1, math.ceil(wait)))  # fmt: skip
        entry = Queued(item, tenant, max(self.min_cost, cost), asked, now)
        if not lane.queue:
            self._bands.setdefault(t.priority, deque()).append(lane)
        lane.queue.append(entry)
        lane.queued_tokens += entry.cost
        return entry

    # ---- out: dispatch -----------------------------------------------------------------
    def pop(self) -> Queued | None:
        """The next request to dispatch (the caller has room for it), or None."""
        ring = next((self._bands[b] for b in sorted(self._bands) if self._bands[b]), None)
        if ring is None:
            return None
        while True:
            lane = ring[0]
            if lane.fresh:  # a new turn
                lane.deficit += self.quantum
                lane.fresh = False
            head = lane.queue[0]
            if head.cost <= lane.deficit:
                lane.deficit -= head.cost
                self._take(lane, head)
                lane.dispatched += 1
                return head
            ring.rotate(-1)  # its turn is over; the deficit waits for the next
            lane.fresh = True

    def remove(self, entry: Queued) -> bool:
        """Take back a request that leaves before dispatch (its client went away); what
        its bucket was charged is given back. False if it is not queued (dispatched)."""
        lane = self.lanes.get(entry.tenant)
        if lane is None or entry not in lane.queue:
            return False
        self._take(lane, entry)
        if lane.bucket is not None:
            lane.bucket.give_back(entry.asked)
        return True

    def _take(self, lane: Lane, entry: Queued) -> None:
        lane.queue.remove(entry)
        lane.queued_tokens -= entry.cost
        if not lane.queue:  # out of the rotation; an idle tenant saves no deficit
            self._bands[lane.tenant.priority].remove(lane)
            lane.deficit, lane.fresh = 0, True

    # ---- what it holds -------------------------------------------------------------------
    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per tenant: its band and rate, requests and uncached tokens queued, requests
        dispatched, and refusals by reason (for the page and /metrics)."""
        return {
            name: {
                "priority": lane.tenant.priority,
                "tokens_per_s": lane.tenant.tokens_per_s,
                "queued": len(lane.queue),
                "queued_tokens": lane.queued_tokens,
                "dispatched": lane.dispatched,
                "rejected": dict(lane.rejected),
            }
            for name, lane in self.lanes.items()
        }
