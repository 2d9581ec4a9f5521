"""The queue-length autoscaler (autoscale.py) on each pool of a disaggregated fleet, SIMULATED.

Kubernetes runs one HPA per Deployment; a disaggregated service deployed as a prefill
Deployment and a decode Deployment gets one each, each on its own pool's symptoms. This
runs one ``Autoscaler`` (the same rules, thresholds and settling window) per pool of a
``DisaggregatedCluster``, so that it and the SLA planner (sla_planner.py) can be compared
on the same fleet: the policy is then the only difference. Each pool's ``FleetState`` is
built from what the cluster tells a planner (``PoolsState``):

- waiting: the requests waiting for a slot on that pool's ready engines;
- attainment: over the last ``window_s``, the share of that pool's own measurements within
  its own target: the TTFT of each first token for the prefill pool, the ITL of each
  finished request for the decode pool (a request's SLO splits at the hand-off);
- idle: an engine that held nothing at a look, since the first look that found it so (to
  within one ``interval_s``: this adapter sees the engines only when it looks).

Pure Python.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minicb.fleet.autoscale import Autoscaler, FleetState, ScaleDecision
from minicb.fleet.sla_planner import POOLS, PoolsState


@dataclass
class PoolAutoscalers:
    """One queue-length ``Autoscaler`` per pool (see the module doc)."""

    scaler: Autoscaler
    ttft_target_s: float = 1.0
    itl_target_s: float = 0.1
    outcomes: dict[str, deque[tuple[float, bool]]] = field(
        default_factory=lambda: {pool: deque() for pool in POOLS}
    )  # pool -> (look time, met) of each measurement in the window
    idle_from: dict[tuple[str, int], float] = field(default_factory=dict)

    @property
    def interval_s(self) -> float:
        return self.scaler.interval_s

    def decide(self, state: PoolsState) -> list[tuple[str, ScaleDecision]]:
        """Each pool's autoscaler's decision, its reason prefixed with the pool."""
        out = []
        measured = {"prefill": [t <= self.ttft_target_s for t in state.ttft_s],
                    "decode": [t <= self.itl_target_s for t in state.itl_s]}  # fmt: skip
        for name in POOLS:
            pool = getattr(state, name)
            window = self.outcomes[name]
            window.extend((state.now, met) for met in measured[name])
            while window and window[0][0] <= state.now - self.scaler.window_s:
                window.popleft()
            for index, held in pool.held.items():
                if held:
                    self.idle_from.pop((name, index), None)
                else:
                    self.idle_from.setdefault((name, index), state.now)
            idle = {index: state.now - self.idle_from[(name, index)]
                    for index in pool.held if (name, index) in self.idle_from}  # fmt: skip
            fleet = FleetState(
                now=state.now, ready=pool.ready, starting=pool.starting, waiting=pool.waiting,
                attainment=sum(m for _, m in window) / len(window) if window else None,
                idle_s=idle, since_ready_s=pool.since_ready_s,
            )  # fmt: skip
            decision = self.scaler.decide(fleet)
            if decision is not None:
                reason = f"{name}: {decision.reason}"
                out.append((name, ScaleDecision(decision.action, decision.replica, reason)))
        return out
