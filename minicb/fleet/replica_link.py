"""One replica process's pipe, read and written by two threads of its own: the replica's
own I/O path.

Without them, the fleet's engine thread itself would wait in ``recv`` for a replica's
reply, and in ``send`` while a replica that stopped reading leaves its socket full: one
stopped replica would hold every other replica's clients for as long as it waited. Here
the reader thread takes every message off the pipe as it comes (so a replica never waits
to send) and notes when it came (so silence is measured whatever the engine thread is
doing); the writer thread sends what it is given (so a caller never waits to send). The
engine thread only looks at ``inbox``, with a deadline of its own choosing.

The replica's heartbeats (replica_worker.py, every HEARTBEAT_S) only move ``heard``; its KV
event records (``kv_events``: the blocks it stored and removed, kv_events.py) go to
``kv_events``, in order, for the router's index, which the fleet reads when it routes (not
when the replica's turn comes); every other message goes to ``inbox`` in the order it came,
then ``CLOSED`` once the pipe has ended (the process exited or was killed).
"""

from __future__ import annotations

import queue
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

CLOSED = ("closed", None, None)  # the last message of a link: the pipe has ended
_STOP = object()  # tells the writer thread to leave


class ReplicaLink:
    """``inbox`` (messages in order, then CLOSED), ``send`` (never waits), ``silent_s``."""

    def __init__(self, conn: Connection, name: str) -> None:
        self.conn = conn
        self.inbox: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self.kv_events: queue.SimpleQueue[Any] = queue.SimpleQueue()  # KV event records
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.heard = time.monotonic()  # when the latest message came (a heartbeat counts)
        self.closed = False  # the pipe has ended (CLOSED is in the inbox)
        for target, role in ((self._read, "reader"), (self._write, "writer")):
            threading.Thread(target=target, name=f"minicb-{name}-{role}", daemon=True).start()

    def send(self, msg: tuple) -> None:
        """Queue ``msg`` for the writer thread; a message to a dead replica is dropped."""
        self._outbox.put(msg)

    def silent_s(self) -> float:
        """Seconds since the replica's latest message, its heartbeats included."""
        return time.monotonic() - self.heard

    def next(self, timeout_s: float) -> tuple | None:
        """The next message (CLOSED after the last), waiting up to ``timeout_s``; None if
        none came in that time."""
        try:
            return self.inbox.get(timeout=timeout_s) if timeout_s > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        """Let the writer go and close the pipe (call it once the process has gone: its exit
        is what ends the reader's ``recv``)."""
        self._outbox.put(_STOP)
        self.conn.close()

    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                self.heard = time.monotonic()
                if msg[0] == "kv_events":
                    self.kv_events.put(msg[1])
                elif msg[0] != "alive":
                    self.inbox.put(msg)
        except (EOFError, OSError, TypeError):  # TypeError: closed under our feet
            pass
        self.closed = True
        self.inbox.put(CLOSED)

    def _write(self) -> None:
        while (msg := self._outbox.get()) is not _STOP:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):  # the process has gone: its reader says so
                return
