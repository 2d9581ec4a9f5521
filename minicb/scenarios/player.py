"""Playing a scenario: its engines, its arrivals round by round, and its narration triggers.

``ScenarioFeeder`` is an engine loop's feeder (like server/workload.py's WorkloadFeeder):
called before each round with the engines, it first looks at what the last round did and
marks the narration points whose trigger fired, then adds this round's arrivals to every
engine at once, so both sides see the same requests at the same round. In a fleet scenario (its
``router``) the two sides are two replicas of one fleet instead: each arrival goes to the
one side that the fleet's ``Router`` (minicb/fleet/router.py) picks, told each side's load
as ``Fleet.loads`` tells it, and the decision is a ``routed`` event on that side's bus, as
``Fleet.add_request`` publishes it, so the page draws the router's reasons. In a
disaggregated scenario (its ``disaggregated`` link) the sides are a prefill engine and a
decode engine: each arrival goes to the prefill engine, and handoff.py's ``Handoffs``
moves each finished prompt, and its KV, to the decode engine. The requests are
``minicb.workload.RequestSpec``s whose arrival is a round, handed out by the one arrival
loop's ``Arrivals`` with the round as its clock. The demo server
pauses at a fired point; ``play`` runs a whole scenario headless (tests, trace export).

Prompts are token ids drawn from the scenario's seed (a named prefix gives every request
that uses it the same first ids), so a scenario runs the same on the real model and on a
simulated GPU, which has no tokenizer. Requests ignore EOS: their lengths are the drawn ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minicb.core.config import EngineConfig
from minicb.fleet.kv_events import KVEventPublisher
from minicb.fleet.router import INDEXED, ReplicaLoad, Route, Router
from minicb.scenarios.handoff import Handoffs
from minicb.scenarios.scenario import PREFILL, Scenario
from minicb.scenarios.side_figures import SideRecord, arrived_transfers
from minicb.workload import Arrivals, RequestSpec

if TYPE_CHECKING:
    from collections.abc import Callable

    from minicb.core.engine import LLMEngine
    from minicb.scenarios.schema import Trigger

FIRST_ID = 100  # prompt ids start above the special tokens of any vocabulary
ID_SPAN = 8000  # and stay inside the smallest vocabulary of the catalogue's models


def arrivals(scenario: Scenario) -> list[RequestSpec]:
    """Every request of the scenario, in arrival order (its arrival: the round before which
    it is added), drawn from its seed."""
    rng = random.Random(scenario.seed)
    prefixes = {
        name: tuple(FIRST_ID + random.Random(name).randrange(ID_SPAN) for _ in range(n))
        for name, n in scenario.prefixes.items()
    }
    out = []
    for g in scenario.requests:
        for i in range(g.count):
            prompt_len = rng.randint(*g.prompt_tokens)
            own = tuple(FIRST_ID + rng.randrange(ID_SPAN) for _ in range(prompt_len))
            ids = prefixes[g.prefix] + own if g.prefix else own
            step = g.arrival_step + i * g.every
            out.append(RequestSpec(list(ids), rng.randint(*g.max_tokens), step,
                                   priority=g.priority, group=g.name))  # fmt: skip
    return sorted(out, key=lambda a: a.arrival)  # stable: a group's order is kept


def build_engines(
    scenario: Scenario, model: str | None = None, profile: str | None = None
) -> dict[str, LLMEngine]:
    """The scenario's two engines, named by side: on its simulated GPU, or on one copy of
    the real model (``model``, default the embedded one). ``profile`` runs a real-model
    scenario on that simulated GPU instead (the tests: no weights, a step-time model)."""
    from minicb.core.engine import LLMEngine

    if scenario.link is not None:
        from minicb.scenarios.handoff import disaggregated_engines

        return disaggregated_engines(scenario)
    configs = {s.name: EngineConfig.from_kwargs(**s.engine) for s in scenario.sides}
    profile = scenario.runner if scenario.simulated else profile
    if profile is not None:
        from minicb.sim.demo import simulated_engines

        return simulated_engines(profile, configs)
    names = list(configs)
    first = LLMEngine(model, configs[names[0]])
    runner = first.runner.with_config(configs[names[1]])
    return {names[0]: first, names[1]: LLMEngine(config=configs[names[1]], runner=runner)}


@dataclass
class ScenarioFeeder:
    """Feeds a scenario's arrivals to its engines and notes which narration points fired."""

    scenario: Scenario
    # Called with the points that fired; the round then waits (the feeder adds nothing
    # until called again): the demo pauses there. None: carry on (a headless run).
    on_narration: Callable[[list[int]], None] | None = None
    round: int = 0  # rounds begun so far
    fired: dict[int, int] = field(default_factory=dict)  # narration index -> round it fired
    records: dict[str, SideRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pending = Arrivals(arrivals(self.scenario))
        self.groups: dict[str, dict[int, str]] = {s.name: {} for s in self.scenario.sides}
        self.router: Router | None = None
        if self.scenario.router is not None:  # replica i is the i-th side
            block_size = EngineConfig.from_kwargs(**self.scenario.sides[0].engine).block_size
            self.router = Router(self.scenario.router, 2, block_size=block_size)
        self.routed = 0  # routing decisions so far, the router's own numbering
        self.told: list[tuple[int, list[int], list[ReplicaLoad]]] = []  # what routing saw
        self.handoffs: Handoffs | None = None  # a disaggregated scenario's, once attached
        self.publishers: list[KVEventPublisher] = []  # an indexed router's KV events, attached

    def attach(self, engines: dict[str, LLMEngine]) -> None:
        """Listen to each engine's bus (call once, before the first round)."""
        for name, engine in engines.items():
            self.records[name] = SideRecord(self.groups[name])
            engine.bus.subscribe(self.records[name])
        if self.scenario.link is not None:
            self.handoffs = Handoffs(engines, self.groups)
        if self.router is not None and self.router.policy in INDEXED:
            # each replica reports what its prefix cache stores and removes, as a fleet's
            # replicas do, into the router's index (in process: no record is ever lost)
            index = self.router.index
            self.publishers = [
                KVEventPublisher(engine, lambda record, i=i: index.apply(i, record))
                for i, engine in enumerate(engines.values())
            ]

    def detach(self, engines: dict[str, LLMEngine]) -> None:
        """Stop listening to the engines' buses (a lesson leaving for another scenario: the
        rebuilt engines keep the buses, which would otherwise feed these records forever)."""
        for name, engine in engines.items():
            engine.bus.unsubscribe(self.records[name])
        if self.handoffs is not None:
            self.handoffs.detach()
        for publisher in self.publishers:
            publisher.close()

    @property
    def done(self) -> bool:
        """No arrival left to add and every narration point shown."""
        return not self.pending and len(self.fired) == len(self.scenario.narration)

    def __call__(self, engines: dict[str, LLMEngine]) -> list[int]:
        """Before a round: the narration points the last round fired (their indices), then
        this round's arrivals added to every engine."""
        new = self._check_triggers()
        if new and self.on_narration is not None:
            self.on_narration(new)
            return new
        if self.handoffs is not None:
            self.handoffs()  # prompts the prefill engine finished go on to the decode engine
        for a in self.pending.due(self.round):
            vocab = min(engine.runner.vocab_size for engine in engines.values())
            ids = [3 + t % (vocab - 3) for t in a.prompt]  # tiny vocabularies too
            if self.handoffs is not None:  # a disaggregated scenario: prefill engine first
                self.groups[PREFILL][self.handoffs.add(ids, a.max_tokens)] = a.group
                continue
            route, now = None, 0.0
            if self.router is not None:
                route = self._route(engines, ids)
                # the fleet's time: its replicas' latest clock (an idle one's stands still)
                now = max(engine.clock() for engine in engines.values())
            for index, (name, engine) in enumerate(engines.items()):
                if route is not None and route.replica != index:
                    continue  # a fleet: the other replica got it
                rid = engine.add_request(ids, a.params(), priority=a.priority)
                self.groups[name][rid] = a.group
                if route is not None and engine.bus.wants("routed"):
                    engine.bus.emit(route.event(rid, now))
        self.round += 1
        return new

    def _route(self, engines: dict[str, LLMEngine], ids: list[int]) -> Route:
        """Which side (replica index, in the sides' order) gets ``ids``: the router's
        decision, told every side's load as Fleet.loads tells it (swapped requests wait)."""
        assert self.router is not None
        loads = [
            ReplicaLoad.of(i, engine.queue_sizes()) for i, engine in enumerate(engines.values())
        ]
        self.told.append((self.routed, list(ids), loads))
        route = self.router.route(self.routed, ids, loads)
        self.routed += 1
        return route

    def _check_triggers(self) -> list[int]:
        new = []
        for i, point in enumerate(self.scenario.narration):
            if i not in self.fired and self._fires(point.trigger):
                self.fired[i] = self.round
                new.append(i)
        return new

    def _fires(self, trigger: Trigger) -> bool:
        if trigger.step is not None:
            return self.round >= trigger.step
        count = 0
        for side, record in self.records.items():
            if trigger.side in (None, side):
                count += sum(
                    1 for rid in _event_ids(record, trigger.event)
                    if trigger.request in (None, record.groups.get(rid))
                )  # fmt: skip
        return count >= trigger.nth


def _event_ids(record: SideRecord, event: str) -> list[int]:
    """The request ids of every ``event`` so far, one per occurrence."""
    if event == "cache_hit":
        return [d.request_id for s in record.steps for d in s.plan.admitted if d.num_cached_tokens]
    if event == "kv_transfer":
        return [e.request_id for e in arrived_transfers(record)]
    if event == "accepted_draft":
        return [
            r.request_id for s in record.steps for r in s.plan.scheduled if r.num_accepted_tokens
        ]
    return [e.request_id for e in record.requests[event]]


def narration_point(
    scenario: Scenario, index: int, feeder: ScenarioFeeder, panels: tuple[str, str]
) -> dict[str, Any]:
    """Narration point ``index`` as a page shows it: its text, the round it fired, and per
    panel (the sides in order) the ids of the requests to highlight, with the blocks."""
    point = scenario.narration[index]
    light = point.highlight
    rows = {
        panel: [rid for rid, g in feeder.groups[side.name].items() if g in light.requests]
        for panel, side in zip(panels, scenario.sides, strict=True)
        if light.side in (None, side.name)
    }
    return {
        "index": index,
        "round": feeder.fired.get(index),
        "text": point.text,
        "highlight": {"panels": rows, "blocks": light.blocks},
    }


@dataclass
class ScenarioResult:
    fired: dict[int, int]  # narration index -> the round at which it fired
    records: dict[str, SideRecord]
    rounds: int
    engines: dict[str, Any]
    feeder: ScenarioFeeder


def play(scenario: Scenario, engines: dict[str, LLMEngine]) -> ScenarioResult:
    """Run ``scenario`` on ``engines`` (build_engines) until every request has finished
    and every narration point has fired, or ``max_steps`` rounds."""
    feeder = ScenarioFeeder(scenario)
    feeder.attach(engines)
    while feeder.round < scenario.max_steps:
        feeder(engines)
        busy = [e for e in engines.values() if e.has_unfinished()]
        if not busy and feeder.done:
            break
        for engine in busy:
            engine.step()
    return ScenarioResult(dict(feeder.fired), feeder.records, feeder.round, engines, feeder)
