"""The demo playing a scenario (``minicb demo --scenario NAME``): its engines, its feeder,
its narration sent to the page, and the page's menu switching to another scenario.

The two engines keep the panel names ``left`` and ``right`` whatever the scenario, so that
switching lessons rebuilds them on their own buses (every browser's subscriptions stay);
the scenario's side names and labels travel in the ``scenario`` part of ``hello``. At a
narration point the ScenarioFeeder (minicb/scenarios/player.py) pauses the engine loop
before the round runs and the hub tells every browser which point fired, with the ids of
the requests to highlight; ``resume`` (or the page's "next") goes on to the next point.
A scenario's arrivals are counted in rounds, so a simulated one needs no pacer: it runs at
one round per loop turn, slowed by ``delay_s``. Runs in the engine thread unless said.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from minicb.core.config import EngineConfig
from minicb.core.runner import VirtualClock
from minicb.scenarios import Scenario, load_scenario, scenario_names
from minicb.scenarios.handoff import role_parts
from minicb.scenarios.player import ScenarioFeeder, narration_point

if TYPE_CHECKING:
    from collections.abc import Callable

    from minicb.core.engine import LLMEngine
    from minicb.core.runner import Runner
    from minicb.driver.engine_loop import EngineLoop

PANELS = ("left", "right")  # the engines' names in the loop, for every scenario
SIMULATED_DELAY_S = 0.05  # a simulated round is instant: slow it enough to watch


def runners(scenario: Scenario, real: Runner | None) -> dict[str, tuple[Runner, Any]]:
    """Each panel's runner and clock for ``scenario``: a simulated GPU of its own with a
    virtual clock, or ``real`` (the model, loaded once) with the wall clock."""
    from minicb.cost_model.catalogue import load_profile
    from minicb.sim.simulated_runner import SimulatedRunner

    out = {}
    profile = load_profile(scenario.runner) if scenario.simulated else None
    for panel, side in zip(PANELS, scenario.sides, strict=True):
        config = EngineConfig.from_kwargs(**side.engine)
        if profile is not None:
            clock = VirtualClock()
            out[panel] = SimulatedRunner(profile, config, clock=clock), clock
        else:
            assert real is not None, "a real-model scenario needs the model loaded"
            out[panel] = real.with_config(config), time.time
    return out


def lesson_engines(scenario: Scenario, model: str | None = None) -> dict[str, LLMEngine]:
    """The two engines of ``scenario`` under the panel names (at start-up)."""
    from minicb.scenarios.player import build_engines

    engines = build_engines(scenario, model)
    return dict(zip(PANELS, engines.values(), strict=True))


class Lesson:
    """The scenario a demo plays; ``notify(message)`` reaches every browser (any thread)."""

    def __init__(self, loop: EngineLoop, scenario: Scenario, model: str | None = None) -> None:
        self.loop, self.model = loop, model
        self.notify: Callable[[dict[str, Any]], None] = lambda message: None
        # the model by device, once loaded: kept while other lessons play, for the next one
        self.real: dict[str, Runner] = {
            e.runner.describe()["device"]: e.runner
            for e in loop.engines.values()
            if not e.describe()["simulated"]
        }
        self._start(scenario)

    def _start(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.feeder = ScenarioFeeder(scenario, on_narration=self._fired)
        self.feeder.attach(self._by_side(self.loop.engines))
        self.loop.feeder = lambda engines: self.feeder(self._by_side(engines))
        self.loop.delay_s = SIMULATED_DELAY_S if scenario.simulated else 0.0

    def _by_side(self, engines: dict[str, LLMEngine]) -> dict[str, LLMEngine]:
        """The panels' engines under the scenario's side names (what its file names)."""
        sides = scenario_sides(self.scenario)
        return {side: engines[panel] for panel, side in zip(PANELS, sides, strict=True)}

    def _fired(self, points: list[int]) -> None:
        """The feeder found narration points: pause before the round, tell the browsers."""
        self.loop.paused = True
        for index in points:
            self.notify({"type": "narration", **self.point(index)})

    def point(self, index: int) -> dict[str, Any]:
        """Narration point ``index`` as the page shows it (player.narration_point)."""
        return narration_point(self.scenario, index, self.feeder, PANELS)

    def describe(self) -> dict[str, Any]:
        """The ``scenario`` part of hello: the lesson, its panels, the points fired so far."""
        s = self.scenario
        return {
            "name": s.name,
            "title": s.title,
            "summary": s.summary,
            "runner": s.runner,
            "panels": {
                p: {"side": d.name, "label": d.label} for p, d in zip(PANELS, s.sides, strict=True)
            },
            "points": len(s.narration),
            "fired": [self.point(i) for i in sorted(self.feeder.fired)],
            "choices": scenario_names(),
            # The page hides the settings form where they would be refused.
            "settings": self.takes_settings,
        }

    @property
    def takes_settings(self) -> bool:
        """Whether engine settings may change: not in a disaggregated lesson, whose prefill
        and decode engines run its roles with its own settings."""
        return self.scenario.link is None

    def _real_runner(self, scenario: Scenario) -> Runner:
        """The model on the device the scenario's settings name ("auto": CUDA where there is
        one; 02b asks for the CPU it speaks of), loaded the first time and kept."""
        from minicb.core.runner.model_runner import ModelRunner, resolve_device

        config = EngineConfig.from_kwargs(**scenario.sides[0].engine)
        device = str(resolve_device(config.device))
        if device not in self.real:
            self.real[device] = ModelRunner(self.model, config)
        return self.real[device]

    def switch(self, name: str) -> dict[str, Any]:
        """Play scenario ``name`` from its start: both engines rebuilt with its settings on
        its runner (the model is loaded the first time a lesson needs it on that device)."""
        scenario = load_scenario(name)
        real = None if scenario.simulated else self._real_runner(scenario)
        built = runners(scenario, real)  # every runner before any engine changes
        # a disaggregated lesson: a prefill and a decode engine, each with its role's scheduler
        parts = role_parts(scenario) if scenario.link is not None else {}
        self.feeder.detach(self._by_side(self.loop.engines))
        for panel, side in zip(PANELS, scenario.sides, strict=True):
            old = self.loop.engines[panel]
            if side.name in parts:
                part = parts[side.name]
                new = old.rebuilt(part.config, runner=part.runner, clock=part.clock,
                                  scheduler=part.build_scheduler)  # fmt: skip
                part.register(new)
            else:
                runner, clock = built[panel]
                config = EngineConfig.from_kwargs(**side.engine)
                new = old.rebuilt(config, runner=runner, clock=clock)
            self.loop.replace_engine(panel, new)
        self._start(scenario)
        self.loop.paused = False
        return self.describe()


def scenario_sides(scenario: Scenario) -> list[str]:
    return [s.name for s in scenario.sides]
