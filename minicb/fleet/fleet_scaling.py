"""The autoscaler's side of a simulated fleet (simulated.py), SIMULATED: what it judges by,
and what its decisions do to the fleet.

``SimulatedFleet`` runs the replicas; with an ``Autoscaler`` (autoscale.py) the fleet also
grows and shrinks, and that is this object's work. It keeps each finished request's
outcome (did it meet both the TTFT and the TPOT target?) for the attainment of the last
``window_s``; at each look it tells the autoscaler the fleet's state (replicas ready and
starting, requests waiting, the attainment, how long each idle replica has been idle) and
carries out the decision: an added replica is built by the fleet and takes requests only
after its start-up delay, costing from the moment it is asked for; a removed one leaves
the router first. Every decision is logged with its time, reason and the replica count
after it. Pure Python: no torch.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from minicb.core.latency import tpot, ttft
from minicb.fleet.autoscale import Autoscaler, FleetState, ScaleDecision
from minicb.telemetry.records import RequestRecord

if TYPE_CHECKING:  # the fleet owns this object; only its type is named here
    from minicb.fleet.simulated import SimulatedFleet


class FleetScaling:
    """One fleet's autoscaler, the outcomes it judges attainment by, and its log."""

    def __init__(self, fleet: SimulatedFleet, autoscaler: Autoscaler) -> None:
        self.fleet, self.autoscaler = fleet, autoscaler
        self.log: list[dict[str, Any]] = []  # each decision, its time and the count
        self._outcomes: deque[tuple[float, bool]] = deque()  # (finish time, met both)

    def finished(self, record: RequestRecord, time: float) -> None:
        """A request has finished at ``time``: whether it met both targets."""
        fleet = self.fleet
        first, last, n = record.token_times[0], record.token_times[-1], len(record.token_times)
        met = ttft(record.arrival, first) <= fleet.ttft_slo and (
            n < 2 or tpot(first, last, n) <= fleet.tpot_slo
        )
        self._outcomes.append((time, met))

    def look(self, now: float) -> None:
        """The autoscaler's look at ``now``, and what it decided, done."""
        active = self.fleet.active
        while self._outcomes and self._outcomes[0][0] < now - self.autoscaler.window_s:
            self._outcomes.popleft()
        ready = [r for r in active if r.ready_at <= now]
        met = [ok for t, ok in self._outcomes if t <= now]
        state = FleetState(
            now=now,
            ready=len(ready),
            starting=len(active) - len(ready),
            waiting=sum(r.load(now).waiting for r in ready),
            attainment=sum(met) / len(met) if met else None,
            idle_s={r.index: now - r.idle_from for r in ready if r.idle_from is not None
                    and r.idle_from <= now and not r.engine.has_unfinished()},
            since_ready_s=now - max(r.ready_at for r in ready) if self.log else None,
        )  # fmt: skip
        decision = self.autoscaler.decide(state)
        if decision is not None:
            self._scale(decision, now)

    def _scale(self, decision: ScaleDecision, now: float) -> None:
        fleet = self.fleet
        if decision.action == "add":
            replica = fleet.router.add()
            fleet.replicas.append(fleet.build_replica(replica, now, now + fleet.startup_s))
        else:
            replica = decision.replica
            fleet.router.remove(replica)
            next(r for r in fleet.active if r.index == replica).removed = now
        self.log.append({"time": now, "action": decision.action, "replica": replica,
                         "reason": decision.reason, "replicas": len(fleet.active)})  # fmt: skip
