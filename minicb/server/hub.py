"""The Hub: what every browser of one app shares, and each browser's ``Client``.

The Hub holds the engines (through the EngineLoop) or, in replay mode, the recorded traces;
the browsers connected (``Client``: a role, what texts it may see, its outbox); the
scheduler's explanations of recent rounds, kept for the single-step control; and the ids of
the requests typed on a page, so that a page's controllers see their own texts where
everyone else's are redacted (``shown``). It never touches an engine itself: it reads the
engines' views in the engine thread, and its frames go out through broadcast.py.

Modes: "demo" (engines, a workload feeder, every control), "serve" (one engine behind
the API), "replay" (no engine: the browser scrubs through recorded traces, which
replay_view.py describes, folds and sends).
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from minicb.core.events import StepEvent
from minicb.server.broadcast import Broadcast
from minicb.server.guard import CONTROLLER, VIEWER, Guard
from minicb.server.redaction import redact_event, with_own_tokens
from minicb.server.replay_view import ReplayViews, replay_info
from minicb.sim.demo import simulation_choices

if TYPE_CHECKING:
    from collections.abc import Callable

    from minicb.driver.engine_loop import EngineLoop
    from minicb.server.lesson import Lesson
    from minicb.telemetry.trace_reader import Trace

MODES = ("demo", "serve", "replay")
KEEP_EXPLANATIONS = 64  # rounds whose decisions stay available to the single-step reply
KEEP_TYPED = 4096  # ids of requests typed on the page, remembered to show their own text


@dataclass(eq=False)
class Client:
    """One browser: its role, whether it sees texts (``True``: all, ``False``: none,
    ``None``: only what this app's controllers typed), and its outbox of messages."""

    role: str = CONTROLLER
    sees_text: bool | None = True
    # Frames (encoded) and replies waiting for its socket; None until its socket is up.
    outbox: asyncio.Queue | None = None
    # Puts a message in this browser's outbox from any thread (set once its socket is up).
    send: Callable[[dict[str, Any]], None] | None = None
    bytes_sent: int = 0
    resyncs: int = 0  # times its backlog was replaced by a fresh view (a slow tab)


class Hub:
    """What every browser of one app shares: the engines (or the traces), and the
    scheduler's explanations of recent rounds, kept for the single-step control.

    ``replay`` maps panel names to recorded traces (replay mode, no engine loop);
    ``guard`` is the door.
    """

    def __init__(
        self,
        engine_loop: EngineLoop | None,
        *,
        mode: str = "demo",
        model_name: str = "",
        replay: dict[str, Trace] | None = None,
        guard: Guard | None = None,
        lesson: Lesson | None = None,
    ) -> None:
        """``lesson``: the scenario a demo plays (lesson.py); its narration reaches every
        browser through ``broadcast``."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode == "replay" and (engine_loop is not None or not replay):
            raise ValueError("replay mode needs at least one trace and no engine loop")
        if mode != "replay" and engine_loop is None:
            raise ValueError(f"{mode} mode needs an engine loop")
        self.loop, self.mode, self.model_name = engine_loop, mode, model_name
        self.replay, self.guard = replay or {}, guard or Guard()
        # replay mode: the traces' messages, built once per text class (replay_view.py)
        self.replay_views = ReplayViews(self.replay, self.shown)
        # engine name -> ids of the requests typed on a page (an ordered set, bounded)
        self.typed: dict[str, OrderedDict[int, None]] = {}
        # the demo's workload (a lesson's feeder is the scenario's, not for the page to set;
        # a served fleet's is its own hand-off work before each round, no workload at all)
        self.feeder = engine_loop.feeder if engine_loop and mode == "demo" and not lesson else None
        self.lesson = lesson
        if lesson is not None:
            lesson.notify = self.broadcast
        # The roles whose first page starts the paused loop (``wait_for_page``); empty once
        # started, or when nobody is awaited.
        self.awaited: tuple[str, ...] = ()
        self.clients: set[Client] = set()
        self.broadcast_frames = Broadcast(self)
        # round number -> {engine name: the plan's decisions in words}
        self._explained: OrderedDict[int, dict[str, list[str]]] = OrderedDict()
        for name, engine in (engine_loop.engines if engine_loop else {}).items():
            engine.bus.subscribe(functools.partial(self._record, name), kinds=["step"])

    # ---- browsers (engine thread) ----------------------------------------------------------
    async def join(self, role: str = CONTROLLER) -> tuple[Client, dict[str, Any]]:
        """A browser's client and its hello, with each engine's view as of the last frame;
        in the asyncio loop, between two frames, so it gets every frame after its view."""
        await self.broadcast_frames.start()
        assert self.loop is not None
        if role in self.awaited:
            self.awaited = ()  # the demo starts now, watched from its first iteration
            await self.loop.acall(lambda: setattr(self.loop, "paused", False))
        hello = await self.loop.acall(lambda: self.hello(role))
        client = self.connect(role)
        hello["engines"] = self.broadcast_frames.views(client)
        return client, hello

    def wait_for_page(self) -> None:
        """Hold the loop paused until the first page joins: the class sees the demo from
        its first iteration, not from wherever it got to while the page was being opened.
        A free demo starts for any page (its audience); a lesson for the first controlling
        page (its teacher, who takes it from one narration point to the next)."""
        assert self.loop is not None
        self.loop.paused = True  # before the loop's thread starts: not one round runs
        self.awaited = (CONTROLLER,) if self.lesson is not None else (CONTROLLER, VIEWER)

    def connect(self, role: str = CONTROLLER) -> Client:
        sees = self.guard.show_text or (
            role == CONTROLLER and (True if self.mode != "serve" else None)
        )
        client = Client(role, sees)
        self.clients.add(client)
        return client

    def broadcast(self, message: dict[str, Any]) -> None:
        """Send ``message`` to every connected browser (any thread), after the frames of
        what the engines did before it (a narration names requests those frames bring)."""
        if self.broadcast_frames.running:
            self.broadcast_frames.notice(message)
            return
        for client in list(self.clients):
            if client.send is not None:
                client.send(message)

    def disconnect(self, client: Client) -> None:
        self.clients.discard(client)
        if not self.clients:
            self.broadcast_frames.close()

    def viewer_figures(self) -> dict[str, float]:
        """Browsers connected and bytes sent to them, for /metrics."""
        return {
            "minicb_viewers": len(self.clients),
            "minicb_viewer_bytes_sent_total": self.broadcast_frames.bytes_sent,
            "minicb_viewer_resyncs_total": sum(c.resyncs for c in self.clients),
        }

    def hello(self, role: str = CONTROLLER) -> dict[str, Any]:
        """The first message a browser gets: mode, model, engines, its role and the control
        state. With an engine loop, call it in the engine thread (it reads the engines'
        views)."""
        loop, controls = self.loop, role == CONTROLLER
        model = self.model_name or next((t.header.get("model") for t in self.replay.values()), "")
        engines = loop.engine_infos() if loop else [replay_info(*i) for i in self.replay.items()]
        return {
            "type": "hello",
            "mode": self.mode,
            "model": model or "",
            "engines": engines,
            "role": role,
            "paused": bool(loop and loop.paused),
            "delay_s": loop.delay_s if loop else 0.0,
            "rounds": loop.rounds if loop else 0,
            "workload": self.feeder.describe() if self.feeder else None,
            # the simulated-GPU picker, or None (a real model; a lesson fixes its runner)
            "simulation": None if self.lesson else simulation_choices(loop),
            "scenario": self._scenario(),  # the lesson played, with its narration, or None
            "controls": {
                "step": controls and loop is not None,
                "workload": controls and self.feeder is not None,
                "settings": controls and self.mode == "demo",
                "prompt": controls and loop is not None,
            },
        }

    def _scenario(self) -> dict[str, Any] | None:
        """The lesson a demo plays, or the one an exported trace recorded (its header)."""
        if self.lesson is not None:
            return self.lesson.describe()
        recorded = (t.header.get("scenario") for t in self.replay.values())
        return next((s for s in recorded if s), None)

    # ---- the scheduler's explanations (a bus listener, engine thread) --------------------
    def _record(self, name: str, steps: Sequence[StepEvent]) -> None:
        # Steps run before the loop counts their round, so this round is rounds + 1.
        assert self.loop is not None  # subscribed only when there is a loop
        round_no = self.loop.rounds + 1
        for event in steps:
            self._explained.setdefault(round_no, {})[name] = event.plan.explain()
        while len(self._explained) > KEEP_EXPLANATIONS:
            self._explained.popitem(last=False)

    def explained(self, round_no: int) -> dict[str, list[str]]:
        return dict(self._explained.get(round_no, {}))

    # ---- texts -----------------------------------------------------------------------------
    def note_typed(self, name: str, request_id: int) -> None:
        """Remember a request typed on a page (engine thread, before it first steps)."""
        typed = self.typed.setdefault(name, OrderedDict())
        typed[request_id] = None
        while len(typed) > KEEP_TYPED:
            typed.popitem(last=False)

    def shown(self, client: Client, name: str, event: dict[str, Any]) -> dict[str, Any]:
        """``event`` (a JSON dict) as ``client`` may see it: where it may not read texts,
        only what the allow-list keeps (redaction.redact_event)."""
        if client.sees_text is True:
            return event
        typed = self.typed.get(name, {}) if client.sees_text is None else {}
        if event.get("request_id") in typed:
            return event
        shown = redact_event(event)
        if typed and event.get("type") == "tokens":  # a step's tokens: its own ones, shown
            return with_own_tokens(shown, event, typed)
        return shown
