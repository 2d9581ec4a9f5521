"""Controls a browser sends over ``/ws``, checked first and then run in the engine thread.

Every control is a JSON object with a ``type``; the reply is one JSON object:
``{"type": "ack", "control": ...}`` (plus what the control reports) or
``{"type": "error", "control": ..., "message": ...}``. A malformed or unknown control gets
an error and changes nothing: every field is checked before anything is touched
(control_fields.py), and a setting the machine could not hold (a KV pool beyond its free
memory, thousands of slots) is refused, naming the limit, before any engine is rebuilt
(engine_rebuild.py); so is a KV pool or a token budget too small for the demo's workload,
and a workload too large for the engines.

    {"type": "pause"} / {"type": "resume"}
    {"type": "step"}                      exactly one round; replies with its decisions
    {"type": "speed", "delay_s": 0.2}     seconds to wait between rounds
    {"type": "workload", "preset": "poisson", "rate": 2, "lengths": "mixed", "count": 16}
    {"type": "settings", "max_num_seqs": 8, "max_num_batched_tokens": 256,
     "enable_chunked_prefill": true, "enable_prefix_caching": true, "num_kv_blocks": 128,
     "preemption_mode": "swap", "policy": "fcfs",
     "static_order": "length", "speculative": "ngram"}
                                          rebuilds the engines (demo only)
    {"type": "prompt", "text": "...", "target": "both", "max_tokens": 32}
    {"type": "simulate", "gpu": "H100-SXM", "model": "llama-3.1-8b"}
                                          another simulated GPU (a --simulate demo only)
    {"type": "pace", "speed": 0.5}        simulated seconds per wall second (the same)
    {"type": "scenario", "name": "03-chunked-prefill"}
                                          play another shipped scenario (a --scenario demo)
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from minicb.core.config import POLICIES, PREEMPTION_MODES, STATIC_ORDERS, SamplingParams
from minicb.cost_model.catalogue import read_catalogue
from minicb.server.control_fields import ControlError, boolean, choice, number, only
from minicb.server.demo_feeder import LENGTHS, PRESETS, WorkloadSpec, encode_prompt
from minicb.server.engine_rebuild import rebuild_engines
from minicb.server.lesson import PANELS
from minicb.server.redaction import text_free
from minicb.speculation.settings import SPECULATIVE_MODES

if TYPE_CHECKING:
    from minicb.driver.engine_loop import EngineLoop
    from minicb.scenarios.handoff import Handoffs
    from minicb.server.hub import Hub

MAX_PROMPT_CHARS = 4000
MAX_SLOTS = 256  # max_num_seqs: more rows than a projector (or two CPU cores) can show
MAX_KV_BLOCKS = 262_144  # whatever the memory: beyond this the KV map is unreadable


# ---- the controls (each gets the live loop; replays have none) -------------------------
async def _pause(hub: Hub, loop: EngineLoop, msg: dict, paused: bool = True) -> dict:
    only(msg, set())
    await loop.acall(lambda: setattr(loop, "paused", paused))
    return {"paused": paused}


async def _step(hub: Hub, loop: EngineLoop, msg: dict) -> dict:
    """Pause if running, then run exactly one round and report its decisions."""
    await _pause(hub, loop, msg)
    round_no = await asyncio.to_thread(loop.step_once)  # waits for the engine thread
    # text-free, as every page's reasons are (the reply may concern API requests' texts)
    explained = {n: [text_free(w) for w in lines] for n, lines in hub.explained(round_no).items()}
    return {"paused": True, "round": round_no, "explain": explained}


async def _speed(hub: Hub, loop: EngineLoop, msg: dict) -> dict:
    only(msg, {"delay_s"})
    delay = number(msg, "delay_s", 0.0, 10.0, kind=float)
    if delay is None:
        raise ControlError("speed needs delay_s (seconds between rounds)")
    await loop.acall(lambda: setattr(loop, "delay_s", delay))
    return {"delay_s": delay}


async def _workload(hub: Hub, loop: EngineLoop, msg: dict) -> dict:
    only(msg, {"preset", "rate", "lengths", "count"})
    feeder = hub.feeder
    if feeder is None:
        raise ControlError("there is no workload feeder in this mode")
    spec = WorkloadSpec(
        preset=choice(msg, "preset", PRESETS, "burst"),
        rate=number(msg, "rate", 0.01, 100.0, feeder.spec.rate, kind=float),
        lengths=choice(msg, "lengths", LENGTHS, feeder.spec.lengths),
        count=number(msg, "count", 1, 1000, feeder.spec.count),
        max_outstanding=feeder.spec.max_outstanding,  # the demo's scale, kept
    )

    def configure() -> None:
        for engine in loop.engines.values():
            feeder.check_fits(engine, spec=spec)
        feeder.configure(spec)

    try:
        await loop.acall(configure)
    except ValueError as err:  # check_fits: naming the engine and the limit
        raise ControlError(f"{err}; the workload was not changed") from err
    return {"workload": feeder.describe()}


SETTINGS: dict[str, Callable[[dict, str], Any]] = {  # each field's check, given its name
    "max_num_seqs": lambda m, k: number(m, k, 1, MAX_SLOTS),
    "max_num_batched_tokens": lambda m, k: number(m, k, 1, 65536),
    "num_kv_blocks": lambda m, k: number(m, k, 1, MAX_KV_BLOCKS),
    "enable_chunked_prefill": lambda m, k: boolean(m, k),
    "enable_prefix_caching": lambda m, k: boolean(m, k),
    "preemption_mode": lambda m, k: choice(m, k, PREEMPTION_MODES),
    "policy": lambda m, k: choice(m, k, POLICIES),
    "static_order": lambda m, k: choice(m, k, STATIC_ORDERS),
    "speculative": lambda m, k: choice(m, k, SPECULATIVE_MODES),
}


async def _settings(hub: Hub, loop: EngineLoop, msg: dict) -> dict:
    only(msg, set(SETTINGS))
    if hub.mode != "demo":
        raise ControlError("engine settings can be changed in the demo only")
    changes = {k: check(msg, k) for k, check in SETTINGS.items() if k in msg}
    if not changes:
        raise ControlError(f"settings needs at least one of {', '.join(SETTINGS)}")
    if hub.lesson is not None and not hub.lesson.takes_settings:
        raise ControlError(
            f"lesson {hub.lesson.scenario.name} runs a prefill engine and a decode engine with "
            "the lesson's settings; choose another lesson to change them"
        )
    try:
        return {"engines": await loop.acall(lambda: rebuild_engines(loop, changes, hub.feeder))}
    except (ValueError, TypeError) as err:  # EngineConfig's own checks
        raise ControlError(str(err)) from err


async def _prompt(hub: Hub, loop: EngineLoop, msg: dict) -> dict:
    only(msg, {"text", "target", "max_tokens"})
    text = msg.get("text")
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_PROMPT_CHARS:
        raise ControlError(f"text must be a non-empty string of at most {MAX_PROMPT_CHARS} chars")
    # With replicas (serve --replicas), a prompt goes through the fleet's router, as an API
    # request does: "both" is then every fleet (one), and the reply names the replica chosen.
    names = list(loop.fleets) or list(loop.engines)
    target = choice(msg, "target", ("both", *names), "both")
    max_tokens = number(msg, "max_tokens", 1, 4096, 32)
    chosen = names if target == "both" else [target]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)

    def add_one(name: str) -> tuple[str, int]:
        fleet = loop.fleets.get(name)
        if fleet is None:
            engine = loop.engines[name]
            return name, engine.add_request(encode_prompt(engine, text), params)
        replica = next(iter(fleet.replicas.values()))  # the same tokenizer in every one
        return fleet.add_request(encode_prompt(replica, text), params)

    def add_to_prefill(handoffs: Handoffs) -> tuple[str, int]:
        """A disaggregated lesson's prompt goes as its requests go: prefill engine first."""
        prefill = loop.engines[PANELS[0]]
        ids = prefill.tokenize(encode_prompt(prefill, text))
        return PANELS[0], handoffs.add(ids, max_tokens)

    def add() -> dict[str, int]:
        handoffs = hub.lesson.feeder.handoffs if hub.lesson is not None else None
        if handoffs is not None:
            ids = dict([add_to_prefill(handoffs)])
        else:
            ids = dict(add_one(name) for name in chosen)
        for name, rid in ids.items():  # before its first step: its tokens show to its typist
            hub.note_typed(name, rid)
        return ids

    try:
        ids = await loop.acall(add)
    except ValueError as err:  # the engine's own refusal, naming the limit
        raise ControlError(str(err)) from err
    return {"ids": ids}


async def _simulate(hub: Hub, loop: EngineLoop, msg: dict) -> dict:
    only(msg, {"gpu", "model"})
    catalogue = read_catalogue()  # names from the catalogue only: no paths from a browser
    gpu = choice(msg, "gpu", tuple(catalogue["gpus"]))
    model = choice(msg, "model", tuple(catalogue["models"]))
    if gpu is None or model is None:
        raise ControlError("simulate needs a gpu and a model from the catalogue")
    if hub.lesson is not None:
        raise ControlError(
            f"lesson {hub.lesson.scenario.name} fixes its runner; choose another lesson, "
            "or start a free demo with --simulate GPU:MODEL"
        )
    if hub.mode != "demo" or not all(e.describe()["simulated"] for e in loop.engines.values()):
        raise ControlError("this demo runs a real model; start one with --simulate GPU:MODEL")
    try:
        from minicb.sim.demo import resimulate

        return {"engines": await loop.acall(lambda: resimulate(loop, f"{gpu}:{model}"))}
    except ValueError as err:  # e.g. weights larger than the GPU's memory
        raise ControlError(str(err)) from err


async def _pace(hub: Hub, loop: EngineLoop, msg: dict) -> dict:
    only(msg, {"speed"})
    speed = number(msg, "speed", 0.01, 1000.0, kind=float)
    if speed is None:
        raise ControlError("pace needs speed (simulated seconds per wall second)")
    if loop.pacer is None:
        raise ControlError("nothing is paced here: only a --simulate demo has a speed factor")
    await loop.acall(lambda: setattr(loop.pacer, "speed", float(speed)))
    return {"speed": speed}


async def _scenario(hub: Hub, loop: EngineLoop, msg: dict) -> dict:
    only(msg, {"name"})
    from minicb.scenarios import ScenarioError, scenario_names

    name = choice(msg, "name", tuple(scenario_names()))  # shipped names only: no paths
    if name is None:
        raise ControlError("scenario needs a name: " + ", ".join(scenario_names()))
    lesson = hub.lesson
    if lesson is None:
        raise ControlError("this demo plays no scenario; start one with --scenario NAME")
    try:
        return {"scenario": await loop.acall(lambda: lesson.switch(name))}
    except (ScenarioError, ValueError) as err:
        raise ControlError(str(err)) from err


HANDLERS: dict[str, Callable[[Hub, EngineLoop, dict], Awaitable[dict]]] = {
    "pause": _pause,
    "resume": functools.partial(_pause, paused=False),
    "step": _step,
    "speed": _speed,
    "workload": _workload,
    "settings": _settings,
    "prompt": _prompt,
    "simulate": _simulate,
    "pace": _pace,
    "scenario": _scenario,
}


async def handle_control(hub: Hub, text: str) -> dict[str, Any]:
    """Check and run one control message; always returns the reply to send."""
    try:
        msg = json.loads(text)
    except (ValueError, TypeError) as err:  # JSONDecodeError, or a number of 5,000 digits
        return {"type": "error", "control": None, "message": f"malformed JSON: {err}"}
    except RecursionError:
        return {"type": "error", "control": None, "message": "malformed JSON: nested too deeply"}
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        return {"type": "error", "control": None, "message": 'a control is an object with "type"'}
    kind = msg["type"]
    handler = HANDLERS.get(kind)
    reply: dict[str, Any] = {"control": kind}
    if "id" in msg:  # echoed so a browser can match replies to requests
        reply["id"] = msg["id"]
    if handler is None:
        known = ", ".join(HANDLERS)
        return {"type": "error", **reply, "message": f"unknown control {kind!r}; known: {known}"}
    try:
        if hub.loop is None:
            raise ControlError("no engine is running (this is a replay)")
        return {"type": "ack", **reply, **await handler(hub, hub.loop, msg)}
    except ControlError as err:
        return {"type": "error", **reply, "message": str(err)}
