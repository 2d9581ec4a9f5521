"""CommandQueue: work handed from other threads to the engine thread, and its answers.

Only the engine thread touches engines (engine_loop.py). A web handler that wants one to do
something puts a command here, ``put(fn)``, and gets a concurrent Future; the engine thread
runs the queued commands between two rounds (``run``), each into its Future, so that an
error goes back to its caller and never kills the thread.

Once the thread is gone (``close``), every queued command and every later one fails at once
with ``EngineStopped``: nobody waits for a thread that will never run it. A lock (the door)
is held while a command goes in and while the end is marked, so that no command slips into
the queue after the last look at it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

# Commands run between two rounds at most: a flood of them (many browsers, many API
# clients) then slows its senders' replies, never the engines' steps.
MAX_COMMANDS_PER_ROUND = 64


class EngineStopped(RuntimeError):
    """The engine thread has ended: nothing sent to it will run."""


class CommandQueue:
    def __init__(self) -> None:
        self._commands: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._door = threading.Lock()
        self.ended: str | None = None  # why the thread ended, once it has

    def put(self, fn: Callable[[], Any]) -> Future:
        """Queue ``fn()`` for the engine thread; its result in a Future (which raises
        EngineStopped at once if the thread has ended)."""
        future: Future = Future()
        with self._door:
            if self.ended is None:
                self._commands.put((fn, future))
                return future
        future.set_exception(EngineStopped(self.ended))
        return future

    def run(self, wait_s: float = 0.0) -> None:
        """In the engine thread: run the queued commands, up to MAX_COMMANDS_PER_ROUND;
        first wait up to ``wait_s`` for one if none is."""
        try:
            command = self._commands.get(timeout=wait_s) if wait_s else self._commands.get_nowait()
            for _ in range(MAX_COMMANDS_PER_ROUND - 1):
                _execute(*command)
                command = self._commands.get_nowait()
            _execute(*command)
        except queue.Empty:
            pass

    def close(self, why: str) -> None:
        """The thread has ended (``why``): fail every queued command, and every later one."""
        with self._door:
            self.ended = why
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineStopped(why))


def _execute(fn: Callable[[], Any], future: Future) -> None:
    """Run one command into its Future: an error goes to the caller, never kills the loop."""
    if future.set_running_or_notify_cancel():
        try:
            future.set_result(fn())
        except BaseException as err:
            future.set_exception(err)
