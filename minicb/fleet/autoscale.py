"""Autoscaling: when to add a replica and when to take one away, with the reason in words.

A service's load changes over the day; a fleet sized for the peak pays for idle GPUs the
rest of the time, and one sized for the average misses its latency targets at the peak.
The policy here is the common shape of production autoscalers (Kubernetes' HPA on a queue
metric, KServe/Knative on concurrency): it looks every ``interval_s`` at the fleet and

- adds a replica when the requests waiting per ready replica exceed
  ``max_waiting_per_replica`` (a queue is forming faster than the replicas drain it) or
  when the share of recently finished requests that met their TTFT and TPOT targets (the
  SLO attainment, over the last ``window_s``) falls below ``min_attainment``;
- adds one at a time and waits for it to start (a replica takes its start-up delay:
  loading weights, building its KV pool), then for one more window, before adding again:
  the queue and the missed targets it was added for are still there while it starts, and
  the attainment of the last window still counts requests from before it could help (the
  stabilisation window of Kubernetes' HPA, for the same reason);
- removes a replica that has had nothing to do for ``idle_s``, down to ``min_replicas``.

``Autoscaler.decide`` is a pure function of a ``FleetState``: the simulated fleet
(minicb/fleet/simulated.py) calls it on virtual time, and a real fleet could call it on
the wall clock. It reacts to symptoms; sla_planner.py sizes a disaggregated fleet's two
pools from a performance model instead, and pool_autoscale.py runs this one on each pool
of that fleet, so the two can be compared there (the ``planner`` reproduction). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FleetState:
    """What the autoscaler is told each time it looks."""

    now: float
    ready: int  # replicas taking requests
    starting: int  # replicas added and not yet ready
    waiting: int  # requests waiting, summed over the ready replicas
    attainment: float | None  # recent requests that met both targets / recent requests
    idle_s: dict[int, float]  # ready replicas with nothing to do: seconds since their last work
    since_ready_s: float | None = None  # since the newest replica became ready (None: never)


@dataclass(frozen=True)
class ScaleDecision:
    action: str  # "add" or "remove"
    replica: int | None  # the replica to remove (None for "add": the fleet names it)
    reason: str


@dataclass(frozen=True)
class Autoscaler:
    min_replicas: int = 1
    max_replicas: int = 8
    max_waiting_per_replica: float = 4.0
    min_attainment: float = 0.9
    idle_s: float = 60.0
    interval_s: float = 5.0
    window_s: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas} and "
                f"{self.max_replicas}"
            )
        for name in ("interval_s", "window_s", "idle_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def state_settling(self, state: FleetState) -> bool:
        """Whether the newest replica became ready less than a window ago."""
        return state.since_ready_s is not None and state.since_ready_s < self.window_s

    def decide(self, state: FleetState) -> ScaleDecision | None:
        """Add, remove, or nothing (None)."""
        total = state.ready + state.starting
        if state.starting:
            return None  # one at a time: judge again once the new replica takes requests
        settling = self.state_settling(state)
        if total < self.max_replicas and not settling:
            per = state.waiting / max(1, state.ready)
            if per > self.max_waiting_per_replica:
                return ScaleDecision(
                    "add", None,
                    f"{state.waiting} waiting on {state.ready} ready replicas ({per:.1f} each, "
                    f"over {self.max_waiting_per_replica:g})",
                )  # fmt: skip
            if state.attainment is not None and state.attainment < self.min_attainment:
                return ScaleDecision(
                    "add", None,
                    f"SLO attainment {state.attainment:.1%} over the last {self.window_s:g} s, "
                    f"under {self.min_attainment:.0%}",
                )  # fmt: skip
        idle = {r: s for r, s in state.idle_s.items() if s >= self.idle_s}
        if idle and total > self.min_replicas:
            replica = max(idle, key=lambda r: (idle[r], r))
            return ScaleDecision(
                "remove", replica, f"replica {replica} idle for {idle[replica]:.0f} s"
            )
        return None
