"""Scenario and its loader: the file's top level, and the names that must agree across it.

``load_scenario("chunked-prefill")`` reads ``minicb/scenarios/chunked-prefill.json`` (or a
path to any JSON file a teacher wrote) and checks it: every field (schema.py), then that
the sides, requests and metrics named by triggers, highlights and claims exist. Pure Python.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minicb.fleet.router import POLICIES
from minicb.scenarios.schema import (
    CLAIM,
    Narration,
    RequestGroup,
    ScenarioError,
    Side,
    _count,
    _need,
    _only,
    _text,
)

HERE = Path(__file__).parent
REAL = "real"  # the runner field's value for the embedded model
# A disaggregated scenario's sides, in this order: the page titles them by role.
PREFILL, DECODE = "prefill0", "decode0"
RUNNER = re.compile(r"^[\w.-]+:[\w.-]+$")  # or a simulated profile, GPU:MODEL
FIELDS = {
    "name", "title", "summary", "runner", "seed", "max_steps", "engine", "sides",
    "prefixes", "requests", "narration", "router", "disaggregated",
}  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    name: str
    title: dict[str, str]
    summary: dict[str, str]
    runner: str  # "real" or a simulated profile "GPU:MODEL"
    sides: tuple[Side, ...]
    requests: tuple[RequestGroup, ...]
    narration: tuple[Narration, ...]
    prefixes: dict[str, int]  # name -> tokens of a shared prompt start
    seed: int = 0
    max_steps: int = 2000  # a run stops here even if requests remain
    # A fleet scenario: the two sides are two replicas of one fleet behind a router with
    # this policy (minicb/fleet/router.py), and each request goes to one of them, not both.
    router: str | None = None
    # A disaggregated scenario: the sides are a prefill engine and a decode engine
    # (handoff.py), and each request's KV crosses this link of the catalogue between them.
    link: str | None = None

    @property
    def simulated(self) -> bool:
        return self.runner != REAL

    def side(self, name: str) -> Side:
        return next(s for s in self.sides if s.name == name)

    @classmethod
    def from_dict(cls, data: Any) -> Scenario:
        _need(data, "scenario", dict, "a JSON object")
        _only(data, "scenario", FIELDS, {"name", "title", "summary", "runner", "sides",
                                         "requests", "narration"})  # fmt: skip
        runner = _need(data["runner"], "runner", str, '"real" or a profile "GPU:MODEL"')
        if runner != REAL and not RUNNER.match(runner):
            raise ScenarioError(f'runner must be "real" or "GPU:MODEL", got {runner!r}')
        prefixes = _need(data.get("prefixes", {}), "prefixes", dict, "an object name -> tokens")
        for name, tokens in prefixes.items():
            _count(tokens, f"prefixes.{name}")
        common = _need(data.get("engine", {}), "engine", dict, "an object of engine settings")
        sides = _need(data["sides"], "sides", list, "a list of two sides")
        if len(sides) != 2:
            raise ScenarioError(f"sides must list exactly two engines, got {len(sides)}")
        router = data.get("router")
        if router is not None and router not in POLICIES:
            raise ScenarioError(
                f"router {router!r} is unknown; choose one of {', '.join(POLICIES)}"
            )
        link = _disaggregated(data.get("disaggregated"), runner, router, sides)
        requests = _need(data["requests"], "requests", list, "a non-empty list")
        narration = _need(data["narration"], "narration", list, "a non-empty list")
        if not requests or not narration:
            raise ScenarioError("requests and narration must not be empty")
        scenario = cls(
            name=_need(data["name"], "name", str, "a name"),
            title=_text(data["title"], "title"),
            summary=_text(data["summary"], "summary"),
            runner=runner,
            sides=tuple(Side.from_dict(s, f"sides[{i}]", common) for i, s in enumerate(sides)),
            requests=tuple(
                RequestGroup.from_dict(r, f"requests[{i}]", prefixes)
                for i, r in enumerate(requests)
            ),
            narration=tuple(
                Narration.from_dict(
                    n,
                    f"narration[{i}]",
                )
                for i, n in enumerate(narration)
            ),  # fmt: skip
            prefixes=dict(prefixes),
            seed=_count(data.get("seed", 0), "seed", 0),
            max_steps=_count(data.get("max_steps", 2000), "max_steps"),
            router=router,
            link=link,
        )
        scenario._check_names()
        return scenario

    def _check_names(self) -> None:
        """Every side, request group and metric named elsewhere in the file exists."""
        from minicb.scenarios.side_figures import METRICS, REQUEST_METRICS

        sides = {s.name for s in self.sides}
        groups = {r.name for r in self.requests}
        if len(sides) != 2:
            raise ScenarioError("sides: the two sides need different names")
        if len(groups) != len(self.requests):
            raise ScenarioError("requests: two groups have the same name")

        def known(value: str | None, names: set[str], where: str, what: str) -> None:
            if value is not None and value not in names:
                raise ScenarioError(
                    f"{where} {value!r} is not a {what} ({', '.join(sorted(names))})"
                )

        for i, point in enumerate(self.narration):
            where = f"narration[{i}]"
            known(point.trigger.side, sides, f"{where}.trigger.side", "side")
            known(point.trigger.request, groups, f"{where}.trigger.request", "request group")
            known(point.highlight.side, sides, f"{where}.highlight.side", "side")
            for name in point.highlight.requests:
                known(name, groups, f"{where}.highlight.requests", "request group")
            for claim in point.claims:
                match = CLAIM.match(claim)
                for operand in (match["left"], match["right"]):
                    if "." not in operand:
                        continue  # a number
                    side, metric = operand.split(".", 1)
                    metric, _, group = metric.partition(":")
                    known(side, sides, f"{where}.claims {claim!r}: side", "side")
                    allowed = REQUEST_METRICS if group else METRICS
                    known(metric, set(allowed), f"{where}.claims {claim!r}: metric", "metric")
                    if group:
                        known(group, groups, f"{where}.claims {claim!r}: request", "request group")


def _disaggregated(data: Any, runner: str, router: str | None, sides: list) -> str | None:
    """A disaggregated scenario's link (``{"link": "NVLink 4"}``), checked against the rest
    of the file: a simulated GPU, no router, the sides prefill0 then decode0."""
    if data is None:
        return None
    from minicb.fleet.kv_transfer import link

    _need(data, "disaggregated", dict, 'an object {"link": "NVLink 4"}')
    _only(data, "disaggregated", {"link"}, {"link"})
    try:
        link(_need(data["link"], "disaggregated.link", str, "a link of the catalogue"))
    except ValueError as err:
        raise ScenarioError(f"disaggregated.link: {err}") from err
    if runner == REAL:
        raise ScenarioError("disaggregated needs a simulated runner (GPU:MODEL), not real")
    if router is not None:
        raise ScenarioError("disaggregated and router do not go together: the sides are a "
                            "prefill engine and a decode engine, not two replicas")  # fmt: skip
    names = [s.get("name") if isinstance(s, dict) else None for s in sides]
    if names != [PREFILL, DECODE]:
        raise ScenarioError(f"disaggregated: the sides must be named {PREFILL} then {DECODE}, "
                            f"got {names}")  # fmt: skip
    return data["link"]


def scenario_names() -> list[str]:
    """The scenarios shipped with minicb, in lesson order (their files' names sort so)."""
    return sorted(p.stem for p in HERE.glob("*.json"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name, or any scenario file by path; ScenarioError if invalid."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = HERE / f"{name_or_path}.json"
        if not path.is_file():
            raise ScenarioError(f"no scenario {name_or_path!r}; shipped: "
                                f"{', '.join(scenario_names())}")  # fmt: skip
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ScenarioError(f"{path}: cannot read it as JSON: {err}") from err
    try:
        return Scenario.from_dict(data)
    except ScenarioError as err:
        raise ScenarioError(f"{path.name}: {err}") from err
