"""EngineLoop: the engines' own thread, and the only place engine state is touched.

It is the driver of the server's engines and of a fleet's (minicb.fleet), so it lives on a
floor below both: it imports the core and this folder only. Web handlers never run model
work (that would stall the event loop and make messages arrive in bursts). They hand work
to this thread with ``call(fn)``, which returns a concurrent Future (the queue:
command_queue.py), and hear back through the engines' buses: a request's tokens and its end
through its RequestStream (request_stream.py), a browser's events through its own
subscriptions (minicb/server/broadcast.py).

If the thread ends (stopped, or a bug that escaped every guard), every queued command and
every later one fails at once with ``EngineStopped``, and every open stream ends with an
error: nobody waits for a thread that is gone. A step that raises ends its engine's
streams with an error and is counted (``failed_steps``, ``last_error``); until a step of
that engine succeeds again, ``failing(name)`` says so (/health answers 503).

Each round the loop runs the queued commands, lets its feeder (the demo's workload, if
any) add that round's arrivals, then steps every engine that has work, one iteration
each, so that several engines (static beside continuous) advance together. ``pause()``
holds the loop; ``step_once()`` runs exactly one round while paused; ``delay_s`` slows it
for watching. With a ``pacer`` (pacing.py), engines on simulated time step only as fast as
the wall clock times its speed factor allows.

A fleet (minicb.fleet: replicas behind a router) is given by name in ``fleets``; its
replicas are engines of the loop like any other. A request submitted to the fleet's name is
routed in this thread (``fleet.add_request`` returns the replica chosen and the request's
id there), and its stream names that replica (``RequestStream.engine``): an abort goes to
the replica that holds the request. Every open stream is kept, by the engine that holds its
request, in ``streams`` (open_streams.py), which a fleet's hand-off moves between engines.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from minicb.core.config import SamplingParams
from minicb.core.engine_like import RoutingFleet, SteppedEngine
from minicb.driver.command_queue import CommandQueue
from minicb.driver.open_streams import OpenStreams
from minicb.driver.pacing import Pacer
from minicb.driver.request_stream import RequestStream

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05  # how long an idle loop sleeps between looks at its command queue
Feeder = Callable[[dict[str, SteppedEngine]], None]


class EngineLoop:
    def __init__(
        self,
        engines: dict[str, SteppedEngine],
        feeder: Feeder | None = None,
        fleets: dict[str, RoutingFleet] | None = None,
    ) -> None:
        """``feeder(engines)``, if given, runs in this thread before every round;
        ``fleets``: name -> a fleet whose replicas are among ``engines`` (minicb.fleet).
        Both are drawn in minicb/core/engine_like.py: engines are stepped, fleets route."""
        self.engines = engines
        self.feeder = feeder
        self.fleets = fleets or {}
        self.streams = OpenStreams(engines)  # each request's stream, by where it is
        self._commands = CommandQueue()
        self.failed_steps: dict[str, int] = dict.fromkeys(engines, 0)
        self.last_error: dict[str, str] = {}  # engine name -> its latest failed step, in words
        self._failing: set[str] = set()  # engines whose latest step failed
        self.paused = False
        self.delay_s = 0.0
        self.pacer: Pacer | None = None  # holds simulated engines to wall time x speed
        self.rounds = 0
        self._single_steps = 0
        self._stop = threading.Event()
        self._stopped_why = "the engine thread was stopped"
        self._thread = threading.Thread(target=self._run, name="minicb-engines", daemon=True)
        self.error: BaseException | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0, why: str = "the engine thread was stopped") -> None:
        """End the thread after its round; open streams and queued commands end with ``why``."""
        self._stopped_why = why
        self._stop.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether commands sent now will run (the thread runs and is not ending)."""
        return self._thread.is_alive() and self._commands.ended is None

    # ---- commands from other threads -----------------------------------------------------
    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` in the engine thread before the next round; its result in a Future
        (which raises EngineStopped at once if the thread has ended)."""
        return self._commands.put(fn)

    def failing(self, name: str) -> bool:
        """Whether ``name``'s latest step failed (no step has succeeded since); a fleet's
        name: whether every one of its replicas' did."""
        fleet = self.fleets.get(name)
        if fleet is not None:
            return all(replica in self._failing for replica in fleet.replicas)
        return name in self._failing

    async def acall(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(self.call(fn))

    def pause(self) -> None:
        self.call(lambda: setattr(self, "paused", True)).result()

    def resume(self) -> None:
        self.call(lambda: setattr(self, "paused", False)).result()

    def step_once(self) -> int:
        """While paused, run exactly one round; returns the round number it ran."""

        def ask() -> int:
            # Runs in the engine thread between rounds, so the target is read before the
            # round it asks for can run (reading it here, after, could miss that round).
            self._single_steps += 1
            return self.rounds + self._single_steps

        target = self.call(ask).result()
        while self.rounds < target and self.alive:
            time.sleep(0.005)
        return self.rounds

    async def submit(
        self,
        engine: str,
        prompt: str | list[int],
        params: SamplingParams,
        priority: int = 0,
        on_queued: Callable[[], None] | None = None,
        token_ids: list[int] | None = None,
    ) -> RequestStream:
        """Add a request and open its token stream. Raises ValueError for a bad request.

        ``on_queued()`` runs in the engine thread right after the request joined the queue;
        ``token_ids``: the prompt's, tokenized already (off this thread). ``engine`` may
        name a fleet: the request goes where its router sends it (``stream.engine``).
        """
        loop = asyncio.get_running_loop()

        def add() -> RequestStream:
            fleet = self.fleets.get(engine)
            eng = fleet or self.engines[engine]
            now = eng.clock()  # one reading: the request's arrival and its stream's alike
            if fleet is not None:
                ids = fleet.tokenize(prompt) if token_ids is None else list(token_ids)
                name, rid = fleet.add_request(prompt, params, priority, now, ids)
            else:
                name = engine
                rid = eng.add_request(
                    prompt, params, priority, arrival_time=now, prompt_token_ids=token_ids
                )
                ids = eng.tokenize(prompt) if token_ids is None else list(token_ids)
            text = prompt if isinstance(prompt, str) else None
            stream = RequestStream(rid, loop, text, ids, engine=name)
            self.streams.add(stream, now)
            if on_queued is not None:
                on_queued()
            return stream

        return await self.acall(add)

    async def abort(self, stream: RequestStream) -> bool:
        """Abort a stream's request; the stream, if open, ends with finish reason "abort"."""
        return await self.acall(functools.partial(self.streams.abort, stream))

    def abort_soon(self, stream: RequestStream) -> Future:
        """``abort`` from a plain function (a closing generator cannot await): queued."""
        return self.call(functools.partial(self.streams.abort, stream))

    def replace_engine(self, name: str, engine: SteppedEngine) -> None:
        """Put ``engine`` (from ``old.rebuilt(config)``) under ``name``; in the engine thread.

        It must share the old engine's bus: every subscriber (streams, browsers, metrics,
        the gate) then keeps listening without being told.
        """
        if engine.bus is not self.engines[name].bus:
            raise ValueError(f"a new {name!r} engine must keep the old one's bus (rebuilt())")
        self.engines[name] = engine
        self._failing.discard(name)  # a new engine has failed no step yet

    def engine_infos(self) -> list[dict[str, Any]]:
        """Each engine's name and description, for a browser; read in the engine thread."""
        return [{"name": name, **engine.describe()} for name, engine in self.engines.items()]

    # ---- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        died = None
        try:
            self._rounds()
        except BaseException as err:
            self.error = err
            died = f"the engine thread died: {type(err).__name__}: {err}"
            log.exception("the engine thread died; every request is ended", exc_info=err)
        finally:
            self._end(died or self._stopped_why)  # stop()'s words, read once it has ended

    def _end(self, why: str) -> None:
        """Fail every queued command and end every open stream: nobody waits for a
        thread that is gone."""
        self._commands.close(why)
        self.streams.end_all(why)

    def _rounds(self) -> None:
        while not self._stop.is_set():
            self._commands.run()
            if self.paused and self._single_steps == 0:
                self._commands.run(IDLE_WAIT_S)
                continue
            if self.pacer is not None:
                self.pacer.advance(self.engines)
            if self.feeder is not None:
                self.feeder(self.engines)
                if self.paused and self._single_steps == 0:
                    continue  # the feeder paused the loop (a scenario's narration point)
            busy = [(n, e) for n, e in self.engines.items() if e.has_unfinished()]
            if self.pacer is not None and not self._single_steps:
                held, busy = busy, self.pacer.due(busy)
                if held and not busy:  # every busy engine is ahead of the wall clock
                    self._commands.run(min(max(self.pacer.wait_s(held), 0.001), IDLE_WAIT_S))
                    continue
            if not busy and self._single_steps == 0:
                self._commands.run(IDLE_WAIT_S)
                continue
            for name, engine in busy:
                self._step(name, engine)
            self.rounds += 1
            if self._single_steps:
                self._single_steps -= 1
            if self.delay_s > 0:
                self._commands.run(self.delay_s)

    def _step(self, name: str, engine: SteppedEngine) -> None:
        """One iteration (its events feed the streams). A step that fails ends every stream
        of the engine with "error"."""
        try:
            engine.step()
        except Exception as err:  # a bug must not take the server down with it
            self.error = err
            log.exception("engine %r failed a step; its requests are ended", name, exc_info=err)
            why = f"internal error: {type(err).__name__}: {err}"
            self.failed_steps[name] = self.failed_steps.get(name, 0) + 1
            self.last_error[name] = why
            self._failing.add(name)
            self.streams.end_all(why, engine=name)
            try:
                engine.abort_all()  # after the streams ended: these aborts find none left
            except Exception:
                log.exception("engine %r could not abort its requests", name)
            return
        self._failing.discard(name)
