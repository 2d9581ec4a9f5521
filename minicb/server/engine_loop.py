"""EngineLoop: the engines' own thread, and the only place engine state is touched.

Web handlers never run model work (that would stall the event loop and make messages
arrive in bursts). They hand work to this thread with ``call(fn)``, which returns a
concurrent Future, and read results from per-request streams or event subscriptions.

Each round the loop runs the queued commands, calls the round hooks (a workload feeder
adds arrivals there), then steps every engine that has work, one iteration each, so that
several engines (static beside continuous) advance together. ``pause()`` holds the loop;
``step_once()`` runs exactly one round while paused; ``delay_s`` slows it for watching.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from minicb.engine import LLMEngine
from minicb.request import RequestOutput, StepResult, TokenDelta
from minicb.config import SamplingParams

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05  # how long an idle loop sleeps between looks at its command queue


@dataclass
class RequestStream:
    """Tokens of one request, delivered to an asyncio consumer without loss."""

    engine: str
    request_id: int
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def push(self, item: TokenDelta | RequestOutput) -> None:
        # Called in the engine thread; the queue belongs to the consumer's event loop.
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def __aiter__(self):
        """Yield TokenDeltas, then the final RequestOutput, then stop."""
        while True:
            item = await self.queue.get()
            yield item
            if isinstance(item, RequestOutput):
                return


class _StreamRouter:
    """An engine observer that forwards each step's tokens to the open RequestStreams."""

    def __init__(self) -> None:
        self.streams: dict[int, RequestStream] = {}

    def step_done(self, result: StepResult) -> None:
        if not self.streams:
            return
        for delta in result.new_tokens:
            if delta.request_id in self.streams:
                self.streams[delta.request_id].push(delta)
        for out in result.finished:
            stream = self.streams.pop(out.request_id, None)
            if stream is not None:
                stream.push(out)


class EngineLoop:
    def __init__(self, engines: dict[str, LLMEngine]) -> None:
        self.engines = engines
        self._routers = {name: _StreamRouter() for name in engines}
        for name, engine in engines.items():
            engine.add_observer(self._routers[name])
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self.round_hooks: list[Callable[[EngineLoop], None]] = []
        self.step_hooks: list[Callable[[str, StepResult], None]] = []
        self.paused = False
        self.delay_s = 0.0
        self.rounds = 0
        self._single_steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="minicb-engines", daemon=True)
        self.error: BaseException | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ---- commands from other threads -------------------------------------------------------
    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` in the engine thread before the next round; its result in a Future."""
        future: Future = Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as err:  # delivered to the caller, never kills the loop
                    future.set_exception(err)

        self._commands.put(run)
        return future

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
        self, engine: str, prompt: str | list[int], params: SamplingParams, priority: int = 0
    ) -> RequestStream:
        """Add a request and open its token stream. Raises ValueError for a bad request."""
        loop = asyncio.get_running_loop()

        def add() -> RequestStream:
            rid = self.engines[engine].add_request(prompt, params, priority)
            stream = RequestStream(engine, rid, loop)
            self._routers[engine].streams[rid] = stream
            return stream

        return await self.acall(add)

    async def abort(self, engine: str, request_id: int) -> bool:
        def drop() -> bool:
            self._routers[engine].streams.pop(request_id, None)
            return self.engines[engine].abort_request(request_id)

        return await self.acall(drop)

    def replace_engine(self, name: str, engine: LLMEngine) -> list[RequestStream]:
        """Swap in a new engine under ``name`` (call it in the engine thread).

        The open token streams of the old engine are returned, already detached, so the
        caller can end them; new streams route through the new engine.
        """
        router = self._routers[name]
        orphans = list(router.streams.values())
        router.streams.clear()
        self.engines[name].remove_observer(router)
        engine.add_observer(router)
        self.engines[name] = engine
        return orphans

    # ---- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._run_commands()
            if self.paused and self._single_steps == 0:
                self._wait_for_command()
                continue
            for hook in self.round_hooks:
                hook(self)
            busy = [(n, e) for n, e in self.engines.items() if e.has_unfinished()]
            if not busy and self._single_steps == 0:
                self._wait_for_command()
                continue
            for name, engine in busy:
                try:
                    result = engine.step()
                except Exception as err:  # a bug must not take the server down with it
                    self._fail_engine(name, err)
                    continue
                for hook in self.step_hooks:
                    hook(name, result)
            self.rounds += 1
            if self._single_steps:
                self._single_steps -= 1
            if self.delay_s > 0:
                self._wait_for_command(self.delay_s)

    def _fail_engine(self, name: str, err: Exception) -> None:
        """Log the error, end every request of that engine with reason "error", free it all."""
        self.error = err
        log.exception("engine %r failed a step; its requests are ended", name, exc_info=err)
        engine = self.engines[name]
        for rid in list(engine.scheduler.requests):
            engine.abort_request(rid)
        for stream in self._routers[name].streams.values():
            stream.push(
                RequestOutput.ended(
                    stream.request_id, "error", f"internal error: {type(err).__name__}: {err}"
                )
            )
        self._routers[name].streams.clear()

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()

    def _wait_for_command(self, timeout: float = IDLE_WAIT_S) -> None:
        try:
            command = self._commands.get(timeout=timeout)
        except queue.Empty:
            return
        command()
