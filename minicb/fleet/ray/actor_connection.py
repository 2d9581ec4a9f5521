"""The fleet's end of a replica actor's queues, shaped like the end of a pipe.

replica_link.py gives each replica a reader thread (``recv`` in a loop) and a writer
thread (``send`` what it is given); this object lets those two threads talk to an actor
instead of a process, so the link, its silence clock and everything above it stay as
they are. ``recv`` long-polls the actor (``pull``: up to PULL_WAIT_S for a message; the
replica's heartbeat comes every 0.5 s) and hands out one message at a time; ``send`` calls
``push`` and waits for it to be taken, so commands arrive in the order they were sent.

When the actor dies (killed, its process gone, its node gone), Ray fails the calls in
flight with ``RayActorError``: both ends raise EOFError then, as a closed pipe would, and
``ended_why`` keeps Ray's words for the message that declares the replica dead.
"""

from __future__ import annotations

from collections import deque
from typing import Any

PULL_WAIT_S = 1.0  # the longest a pull waits at the actor for the first message
CALL_TIMEOUT_S = 30.0  # a pull or push that took this long (the node is unreachable): ended


class ActorConnection:
    """``recv`` and ``send`` over an actor's ``pull`` and ``push`` (see the module doc)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.ended_why: str | None = None  # Ray's words for the actor's end, once it ended
        self._pending: deque[tuple] = deque()
        self._closed = False

    def recv(self) -> tuple:
        import ray

        while not self._pending:
            if self._closed:
                raise EOFError("the link was closed")
            try:
                batch = ray.get(self.actor.pull.remote(PULL_WAIT_S), timeout=CALL_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                continue  # a node that answers nothing: silence, which replica_process times
            except ray.exceptions.RayError as err:
                raise EOFError(self._ended(err)) from err
            except SystemExit as err:  # Ray's own way of ending a wait as this process leaves
                raise EOFError("Ray is shutting down in this process") from err
            for msg in batch:
                if msg[0] == "ended":  # the replica's loop returned (it was told to stop)
                    self.ended_why = self.ended_why or "its replica loop returned"
                    raise EOFError(self.ended_why)
                self._pending.append(msg)
        return self._pending.popleft()

    def send(self, msg: tuple) -> None:
        import ray

        if self._closed:
            raise OSError("the link was closed")
        try:
            ray.get(self.actor.push.remote(msg), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayError as err:  # a timeout too: the reader says the rest
            raise OSError(self._ended(err)) from err

    def close(self) -> None:
        self._closed = True

    def _ended(self, err: Exception) -> str:
        """Ray's first line about the actor's end (its last lines say why: killed, its
        node died, its process exited)."""
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        why = lines[-1] if lines else type(err).__name__
        self.ended_why = self.ended_why or f"Ray: {why}"
        return self.ended_why
