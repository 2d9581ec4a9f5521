"""Scenario: one lesson of the classroom, read from a JSON file and checked field by field.

A scenario is data, never code, so that a teacher writes a new one without touching
Python (docs/scenarios.md documents every field). ``Scenario.from_dict`` turns the JSON
object into frozen dataclasses and raises ``ScenarioError`` naming the field at fault
(``narration[2].trigger.event``), the value given and what is allowed. Pure Python: no
torch, so the page's menu and the tests read scenarios without loading a model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from minicb.core.config import EngineConfig

LANGUAGES = ("en", "zh")
# Events a narration point may wait for (the engine's request events; "cache_hit" is an
# admission that found part of its prompt in the prefix cache, "accepted_draft" a step that
# kept at least one of a request's speculative draft tokens, "routed" a fleet scenario's
# router sending a request to that side's replica, "kv_transfer" a disaggregated scenario's
# KV cache having arrived on the decode side).
TRIGGER_EVENTS = (
    "arrived",
    "admitted",
    "first_token",
    "preempted",
    "swapped_out",
    "swapped_in",
    "finished",
    "cache_hit",
    "accepted_draft",
    "routed",
    "kv_transfer",
)
BLOCK_HIGHLIGHTS = ("none", "requests", "shared")
# "side.metric" or "side.metric:request" (metrics.py lists the metrics).
CLAIM = re.compile(
    r"^(?P<left>[\w-]+\.[\w]+(?::[\w-]+)?) (?P<op><=|>=|<|>) "
    r"(?:(?P<factor>\d+(?:\.\d+)?) \* )?(?P<right>[\w-]+\.[\w]+(?::[\w-]+)?|\d+(?:\.\d+)?)$"
)


class ScenarioError(ValueError):
    """A scenario file that is not valid; the message names the field."""


def _need(data: Any, where: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(data, kind) or isinstance(data, bool) and kind is not bool:
        raise ScenarioError(f"{where} must be {what}, got {data!r}")
    return data


def _only(data: dict, where: str, allowed: set[str], required: set[str] = frozenset()) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )
    missing = sorted(required - set(data))
    if missing:
        raise ScenarioError(f"{where}: missing field(s) {', '.join(missing)}")


def _text(data: Any, where: str) -> dict[str, str]:
    """A text in every language: {"en": ..., "zh": ...}, none empty."""
    _need(data, where, dict, 'an object {"en": ..., "zh": ...}')
    _only(data, where, set(LANGUAGES), set(LANGUAGES))
    for lang in LANGUAGES:
        if not isinstance(data[lang], str) or not data[lang].strip():
            raise ScenarioError(f"{where}.{lang} must be a non-empty string")
    return dict(data)


def _count(data: Any, where: str, low: int = 1) -> int:
    if not isinstance(data, int) or isinstance(data, bool) or data < low:
        raise ScenarioError(f"{where} must be an integer >= {low}, got {data!r}")
    return data


def _range(data: Any, where: str) -> tuple[int, int]:
    """An integer, or [low, high] drawn from uniformly per request (the scenario's seed)."""
    if isinstance(data, list):
        if len(data) != 2:
            raise ScenarioError(f"{where} must be an integer or [low, high], got {data!r}")
        low, high = _count(data[0], f"{where}[0]"), _count(data[1], f"{where}[1]")
        if low > high:
            raise ScenarioError(f"{where}: low {low} is above high {high}")
        return low, high
    value = _count(data, where)
    return value, value


@dataclass(frozen=True)
class RequestGroup:
    """``count`` requests arriving from round ``arrival_step``, one every ``every`` rounds."""

    name: str
    prompt_tokens: tuple[int, int]
    max_tokens: tuple[int, int]
    arrival_step: int = 0
    count: int = 1
    every: int = 0
    priority: int = 0
    prefix: str | None = None  # a shared prompt start, from the scenario's "prefixes"

    @classmethod
    def from_dict(cls, data: Any, where: str, prefixes: dict[str, int]) -> RequestGroup:
        _need(data, where, dict, "an object")
        known = {f.name for f in fields(cls)}
        _only(data, where, known, {"name", "prompt_tokens", "max_tokens"})
        name = _need(data["name"], f"{where}.name", str, "a name")
        if not re.fullmatch(r"[\w-]+", name):
            raise ScenarioError(f"{where}.name must be letters, digits, _ or -, got {name!r}")
        prefix = data.get("prefix")
        if prefix is not None and prefix not in prefixes:
            raise ScenarioError(
                f"{where}.prefix {prefix!r} is not in prefixes "
                f"({', '.join(prefixes) or 'none defined'})"
            )
        priority = data.get("priority", 0)
        _need(priority, f"{where}.priority", int, "an integer (lower runs first)")
        return cls(
            name=name,
            prompt_tokens=_range(data["prompt_tokens"], f"{where}.prompt_tokens"),
            max_tokens=_range(data["max_tokens"], f"{where}.max_tokens"),
            arrival_step=_count(data.get("arrival_step", 0), f"{where}.arrival_step", 0),
            count=_count(data.get("count", 1), f"{where}.count"),
            every=_count(data.get("every", 0), f"{where}.every", 0),
            priority=priority,
            prefix=prefix,
        )


@dataclass(frozen=True)
class Side:
    """One of the engines shown side by side: its panel name, label and settings."""

    name: str
    label: dict[str, str]
    engine: dict[str, Any]

    @classmethod
    def from_dict(cls, data: Any, where: str, common: dict[str, Any]) -> Side:
        _need(data, where, dict, "an object")
        _only(data, where, {"name", "label", "engine"}, {"name", "label"})
        name = _need(data["name"], f"{where}.name", str, "a name")
        if not re.fullmatch(r"[\w-]+", name):
            raise ScenarioError(f"{where}.name must be letters, digits, _ or -, got {name!r}")
        engine = {**common, **_need(data.get("engine", {}), f"{where}.engine", dict, "an object")}
        try:
            EngineConfig.from_kwargs(**engine)
        except (TypeError, ValueError) as err:
            raise ScenarioError(f"{where}.engine: {err}") from err
        return cls(name=name, label=_text(data["label"], f"{where}.label"), engine=engine)


@dataclass(frozen=True)
class Trigger:
    """When a narration point shows: after round ``step``, or at the ``nth`` ``event``
    (of ``request``'s group, on ``side``, where given)."""

    step: int | None = None
    event: str | None = None
    side: str | None = None
    request: str | None = None
    nth: int = 1

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Trigger:
        _need(data, where, dict, 'an object such as {"step": 5} or {"event": "preempted"}')
        _only(data, where, {f.name for f in fields(cls)})
        if ("step" in data) == ("event" in data):
            raise ScenarioError(f"{where} needs exactly one of step or event")
        if "step" in data:
            if set(data) != {"step"}:
                raise ScenarioError(f"{where}: a step trigger takes no other field")
            return cls(step=_count(data["step"], f"{where}.step"))
        if data["event"] not in TRIGGER_EVENTS:
            raise ScenarioError(
                f"{where}.event {data['event']!r} is unknown; choose one of "
                f"{', '.join(TRIGGER_EVENTS)}"
            )
        return cls(
            event=data["event"],
            side=data.get("side"),
            request=data.get("request"),
            nth=_count(data.get("nth", 1), f"{where}.nth"),
        )


@dataclass(frozen=True)
class Highlight:
    """What the page marks at a narration point: request rows, and their or shared blocks."""

    side: str | None = None  # None: both sides
    requests: tuple[str, ...] = ()
    blocks: str = "none"

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Highlight:
        _need(data, where, dict, "an object")
        _only(data, where, {"side", "requests", "blocks"})
        requests = _need(data.get("requests", []), f"{where}.requests", list, "a list of names")
        blocks = data.get("blocks", "none")
        if blocks not in BLOCK_HIGHLIGHTS:
            raise ScenarioError(
                f"{where}.blocks {blocks!r} is unknown; choose one of {', '.join(BLOCK_HIGHLIGHTS)}"
            )
        return cls(side=data.get("side"), requests=tuple(requests), blocks=blocks)


@dataclass(frozen=True)
class Narration:
    trigger: Trigger
    text: dict[str, str]
    highlight: Highlight = field(default_factory=Highlight)
    claims: tuple[str, ...] = ()  # what the text says, as checks on the run (metrics.py)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Narration:
        _need(data, where, dict, "an object")
        _only(data, where, {"trigger", "text", "highlight", "claims"}, {"trigger", "text"})
        claims = _need(data.get("claims", []), f"{where}.claims", list, "a list of strings")
        for i, claim in enumerate(claims):
            if not isinstance(claim, str) or not CLAIM.match(claim):
                raise ScenarioError(
                    f"{where}.claims[{i}] {claim!r} is not 'side.metric OP [k *] side.metric'"
                    " (OP one of < <= > >=)"
                )
        return cls(
            trigger=Trigger.from_dict(data["trigger"], f"{where}.trigger"),
            text=_text(data["text"], f"{where}.text"),
            highlight=Highlight.from_dict(data.get("highlight", {}), f"{where}.highlight"),
            claims=tuple(claims),
        )
