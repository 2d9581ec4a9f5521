"""A fleet of SIMULATED replicas behind the router, on virtual time: data-centre scale.

Each replica is the real engine on a ``SimulatedRunner`` (minicb/sim/simulated_runner.py)
with its own ``VirtualClock``, as ``minicb.sim.run`` drives one; the fleet runs them
together in time order: of the next arrival, the next autoscaling look and the earliest end
of a replica's step, it does whichever comes first (a discrete-event simulation: a
replica's step starts at its own clock, so it sees only the requests routed to it by then).
A request is routed by ``minicb.fleet.router.Router``, the same code that routes for the
real replicas, told each replica's waiting and running requests at that moment; an idle
replica's clock jumps to the arrival. The requests come from the one workload module: an
``Arrivals`` (open loop) or a ``ChatSessions`` (a closed loop: each turn after the previous
answer).

With an ``Autoscaler`` (autoscale.py) the fleet grows and shrinks (fleet_scaling.py): an
added replica takes requests only after its start-up delay (``startup_s``) and costs from
the moment it is added. Cost is GPU-hours (replica-seconds x GPUs per replica) at the
catalogue's illustrative price (fleet_figures.py).

With a ``FairQueue`` (minicb/fleet/tenancy/) requests do not go to a replica as they arrive:
they wait in the queue, each under its tenant (``RequestSpec.group``), and one leaves it
whenever a ready replica has fewer than ``max_in_flight`` requests, at the time it has
room (a busy replica's next step, an idle one's readiness), routed among the replicas
with room. Its TTFT counts the wait, from its arrival. Refused requests (a full queue, a
tenant over its rate) are counted in ``refused``.

Each replica publishes its KV events (kv_events.py) as a real replica does, and the fleet
hands each record to the router's index (``deliver_kv``: a test drops some there); a
replica the index lost track of is asked for a snapshot at the next decision and answers
by the one after (a round trip, as over a real pipe): the decision in between counts none
of its blocks.

Each routing decision is also a ``routed`` event (``RequestRouted``) on the fleet's own
``bus``, stamped with the virtual time, as the real fleet publishes them.

``run`` returns the fleet's figures, all labelled ``simulated``: the one metrics summary
(``MetricsCollector``'s, merged over the replicas) with goodput under the TTFT and TPOT
targets, the prefix cache's hit rate, cost per million output tokens, every route and every
scaling decision with its reason. Pure Python: no torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from minicb.core.bus import EventBus
from minicb.core.config import EngineConfig
from minicb.core.engine import LLMEngine
from minicb.core.runner import VirtualClock
from minicb.cost_model.catalogue import load_profile
from minicb.cost_model.step_time import StepTimeModel
from minicb.fleet.autoscale import Autoscaler
from minicb.fleet.fleet_figures import gpu_price, merge_metrics, replica_startup_s
from minicb.fleet.fleet_scaling import FleetScaling
from minicb.fleet.kv_events import KVEventBatch, KVEventPublisher
from minicb.fleet.router import ReplicaLoad, Route, Router
from minicb.fleet.tenancy.fair_queue import FairQueue, Refused
from minicb.fleet.tenancy.uncached import uncached_tokens
from minicb.parallel.settings import ParallelSettings
from minicb.sim.simulated_runner import SimulatedRunner
from minicb.telemetry.metrics import MetricsCollector
from minicb.workload import RequestSpec


class ArrivalSource(Protocol):
    """``Arrivals`` or ``ChatSessions`` (which also has ``answered``)."""

    def __bool__(self) -> bool: ...
    @property
    def next_time(self) -> float | None: ...
    def due(self, now: float) -> list[RequestSpec]: ...


@dataclass
class SimulatedReplica:
    """One engine on its own simulated GPU(s) and clock."""

    index: int
    engine: LLMEngine
    runner: SimulatedRunner
    added: float  # when it was asked for: it costs from here
    ready_at: float  # when it takes requests
    metrics: MetricsCollector = field(default_factory=MetricsCollector)
    finished: list[Any] = field(default_factory=list)  # finished events not yet handled
    requests: dict[int, RequestSpec] = field(default_factory=dict)  # engine id -> request
    idle_from: float | None = None
    removed: float | None = None
    kv_events: KVEventPublisher = field(init=False)  # what it publishes of its prefix cache

    @property
    def clock(self) -> VirtualClock:
        return self.runner.clock

    def load(self, now: float) -> ReplicaLoad:
        return ReplicaLoad.of(self.index, self.engine.queue_sizes(), alive=now >= self.ready_at)


class SimulatedFleet:
    """N simulated replicas of one profile behind a ``Router`` (see the module doc)."""

    def __init__(
        self,
        profile: StepTimeModel | str,
        config: EngineConfig,
        router: Router | str,
        num_replicas: int = 1,
        *,
        autoscaler: Autoscaler | None = None,
        startup_s: float | None = None,
        ttft_slo: float = 1.0,
        tpot_slo: float = 0.1,
        queue: FairQueue | None = None,
        max_in_flight: int = 8,
    ) -> None:
        """``queue``: hold requests in this fair queue until a replica has fewer than
        ``max_in_flight`` (None: route each as it arrives, no bound)."""
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        if isinstance(profile, str):
            profile = load_profile(profile, ParallelSettings.of(config).tensor_parallel_size)
        if isinstance(router, str):
            router = Router(router, num_replicas, block_size=config.block_size)
        self.profile, self.config, self.router = profile, config, router
        self.startup_s = replica_startup_s(profile) if startup_s is None else startup_s
        self.ttft_slo, self.tpot_slo = ttft_slo, tpot_slo
        self.replicas = [self.build_replica(i, 0.0, 0.0) for i in router.replicas]
        self.routes: list[Route] = []
        self.bus = EventBus()  # the fleet's own events: each routing decision ("routed")
        self.told: list[tuple[int, list[int], list[ReplicaLoad]]] = []  # what routing saw
        self.scaler = FleetScaling(self, autoscaler) if autoscaler else None  # it grows, shrinks
        self._next_id = 0
        self._asked: list[int] = []  # replicas asked for a snapshot at the last decision
        self.queue, self.max_in_flight = queue, max_in_flight
        self.refused: list[tuple[RequestSpec, Refused]] = []
        # every request placed: (it, its replica's index, its id there), for per-tenant figures
        self.placed: list[tuple[RequestSpec, int, int]] = []
        self._now = 0.0

    def build_replica(self, index: int, added: float, ready_at: float) -> SimulatedReplica:
        """Replica ``index``, asked for at ``added`` and taking requests at ``ready_at``."""
        clock = VirtualClock(ready_at)
        runner = SimulatedRunner(self.profile, self.config, clock=clock)
        replica = SimulatedReplica(
            index, LLMEngine(config=self.config, runner=runner, clock=clock), runner,
            added, ready_at, idle_from=ready_at,
        )  # fmt: skip
        replica.engine.bus.subscribe(replica.metrics)
        replica.engine.bus.subscribe(replica.finished.extend, kinds=["finished"])
        replica.kv_events = KVEventPublisher(
            replica.engine, lambda record: self.deliver_kv(index, record)
        )
        return replica

    def deliver_kv(self, replica: int, record: KVEventBatch) -> None:
        """A replica's KV event record reaches the router's index (at once: the simulated
        link loses nothing unless a test makes it)."""
        self.router.index.apply(replica, record)

    @property
    def active(self) -> list[SimulatedReplica]:
        return [r for r in self.replicas if r.removed is None]

    # ---- the event loop --------------------------------------------------------------------
    def run(self, source: ArrivalSource) -> dict[str, Any]:
        """Every request of ``source`` through the fleet; the figures (``summary``)."""
        interval = self.scaler.autoscaler.interval_s if self.scaler else math.inf
        next_look = interval
        while source or self.queue or any(r.engine.has_unfinished() for r in self.active):
            busy = [r for r in self.active if r.engine.has_unfinished()]
            t_step = min((r.clock() for r in busy), default=math.inf)
            t_arrival = source.next_time if source.next_time is not None else math.inf
            t_room = self._room_time()
            if min(t_arrival, t_step, next_look, t_room) == math.inf:
                break  # nothing can happen (a closed loop waiting on nothing)
            self._now = min(t_arrival, t_step, next_look, t_room)
            if t_arrival <= t_step and t_arrival <= next_look and t_arrival <= t_room:
                for request in source.due(t_arrival):
                    self._arrive(request, t_arrival)
            elif t_room <= t_step and t_room <= next_look:
                self._dispatch(t_room)
            elif next_look <= t_step:
                self.scaler.look(next_look)
                next_look += interval
            else:
                self._step(min(busy, key=lambda r: (r.clock(), r.index)), source)
        return self.summary()

    def _arrive(self, request: RequestSpec, now: float) -> None:
        if self.queue is None:
            return self._route(request, now)
        prompt = list(request.prompt)
        cost = uncached_tokens(self.router, prompt)
        try:
            self.queue.push(request, request.group, cost, len(prompt) + request.max_tokens, now)
        except Refused as refused:
            self.refused.append((request, refused))

    def _has_room(self, replica: SimulatedReplica, now: float) -> bool:
        return replica.ready_at <= now and len(replica.requests) < self.max_in_flight

    def _room_time(self) -> float:
        """When the queue can next send a request: the earliest time a replica has room
        (a busy one at its next step, an idle one once ready), never before now."""
        if self.queue is None or not len(self.queue):
            return math.inf
        times = [max(self._now, r.clock() if r.engine.has_unfinished() else r.ready_at)
                 for r in self.active if len(r.requests) < self.max_in_flight]  # fmt: skip
        return min(times, default=math.inf)

    def _dispatch(self, now: float) -> None:
        """The fair queue's next request, routed among the replicas with room now."""
        assert self.queue is not None
        entry = self.queue.pop()
        assert entry is not None
        full = {r.index for r in self.active if not self._has_room(r, now)}
        self._route(entry.item, now, arrival=entry.arrival, full=full)

    def _route(
        self,
        request: RequestSpec,
        now: float,
        arrival: float | None = None,
        full: set[int] = frozenset(),  # type: ignore[assignment]
    ) -> None:
        request_id, self._next_id = self._next_id, self._next_id + 1
        active = {r.index: r for r in self.active}
        for index in self._asked:  # the snapshots asked for at the last decision
            if index in active:
                self.router.index.install(index, active[index].kv_events.snapshot())
        self._asked = self.router.index.wanted(active.__contains__)
        loads = [r.load(now) for r in self.active]
        # a replica without room is not there for this decision
        loads = [dataclasses.replace(x, alive=False) if x.replica in full else x for x in loads]
        prompt = list(request.prompt)
        route = self.router.route(request_id, prompt, loads)
        self.routes.append(route)
        self.told.append((request_id, prompt, loads))
        if self.bus.wants("routed"):
            self.bus.emit(route.event(request_id, now))
        replica = next(r for r in self.active if r.index == route.replica)
        if not replica.engine.has_unfinished() and replica.clock() < now:
            replica.clock.advance(now - replica.clock())  # idle until now
        replica.idle_from = None
        rid = replica.engine.add_request(
            prompt, request.params(), arrival_time=now if arrival is None else arrival,
            expected_output_tokens=request.output_tokens,
        )  # fmt: skip
        if request.stops_early:
            replica.runner.output_lengths[rid] = request.output_tokens
        replica.requests[rid] = request
        self.placed.append((request, replica.index, rid))

    def _step(self, replica: SimulatedReplica, source: ArrivalSource) -> None:
        answers = {out.request_id: out.token_ids for out in replica.engine.step().finished}
        answered = getattr(source, "answered", None)
        for event in replica.finished:
            if self.scaler:  # the attainment it judges by
                self.scaler.finished(replica.metrics.requests[(0, event.request_id)], event.time)
            request = replica.requests.pop(event.request_id)
            if answered is not None:  # the next turn sends back what the model said
                answered(request, event.time, answers.get(event.request_id))
        replica.finished.clear()
        if not replica.engine.has_unfinished():
            replica.idle_from = replica.clock()

    @property
    def scaling(self) -> list[dict[str, Any]]:
        """The autoscaler's decisions, each with its time, reason and the replica count."""
        return self.scaler.log if self.scaler else []

    # ---- the figures -----------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The fleet's figures (simulated): the merged metrics summary, cost, routes."""
        merged = merge_metrics([r.metrics for r in self.replicas])
        end, tp = merged.t_max or 0.0, self.profile.tp
        gpu_s = sum(((r.removed if r.removed is not None else end) - r.added) * tp
                    for r in self.replicas)  # fmt: skip
        dollars = gpu_s / 3600 * gpu_price(self.profile)
        out_tokens = sum(rec.num_output_tokens for rec in merged.requests.values())
        return {
            "simulated": True,
            "profile": self.profile.name,
            "policy": self.router.policy,
            "replicas_max": max(self.replica_counts()),
            "summary": merged.summary(self.ttft_slo, self.tpot_slo),
            "gpu_hours": gpu_s / 3600,
            "usd": dollars,
            "usd_per_m_output_tokens": dollars / out_tokens * 1e6 if out_tokens else None,
            "routes": [vars(r) for r in self.routes],
            "scaling": self.scaling,
            "startup_s": self.startup_s,
        }

    def replica_counts(self) -> list[int]:
        """The replica count after each scaling decision (the first: the fleet at start)."""
        start = len(self.replicas) - sum(s["action"] == "add" for s in self.scaling)
        return [start] + [s["replicas"] for s in self.scaling]

