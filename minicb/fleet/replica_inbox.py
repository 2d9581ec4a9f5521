"""What a replica's process sends, taken in the order it came: the engine thread's side of
the pipe.

The pipe has its own reader and writer threads (replica_link.py), so the engine thread
never waits in ``send`` or ``recv``; it looks at the messages here, with a deadline of its
own. A message is a step's events (handed to the handle, ``deliver``, which publishes
them), a failed step (held until the engine loop's next turn raises it, with what came
after it held too), a reply to a round trip, or the pipe's end. Each carries the replica's
load (``load``: what the router reads).

``turn`` is the engine loop's turn for this replica: it publishes what has come (waiting up
to STEP_WAIT_S). A round trip (``call``) sends a command and waits for its reply, taking
the events that come before it, and, every CALL_POLL_S, lets the other replicas publish
theirs (``meanwhile``). A round trip still waits for the replica's current step (its
engine runs commands between steps): while the replica is heard from, up to its stall
timeout; once it falls silent, no longer (replica_process.py says when it is gone).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from minicb.fleet.replica_link import CLOSED
from minicb.fleet.replica_process import STEP_WAIT_S, ReplicaDied, ReplicaProcess, idle_load

log = logging.getLogger(__name__)

CALL_POLL_S = 0.05  # how often a round trip looks up from its wait (others' events, silence)


class ReplicaInbox:
    """The messages of ``child``'s process, in order (see the module doc)."""

    def __init__(self, child: ReplicaProcess, deliver: Callable[[list], None]) -> None:
        self.child, self._deliver = child, deliver
        self.calling = False  # a round trip is under way
        self.load = idle_load()
        self._failure: str | None = None  # a failed step not raised from a turn yet
        self._held: deque[tuple] = deque()  # what came after that failure, in order

    def turn(self) -> dict[str, Any] | None:
        """Publish what has come (waiting up to STEP_WAIT_S for something); raises
        ReplicaDied (once per death) or a failed step's error. While a restarted process
        loads, a turn only looks for its ready message, and returns it once it has come."""
        child = self.child
        try:
            if child.unsaid_death is not None:
                raise ReplicaDied(child.unsaid_death)
            if child.starting:
                return child.watch_start()
            self._raise_failure()
            if child.dead is not None:
                raise ReplicaDied(child.dead)
            self._publish(STEP_WAIT_S)
            self._raise_failure()
            child.check()
            return None
        except ReplicaDied:
            child.unsaid_death = None  # said now: the engine loop ends its requests with it
            raise

    def publish_now(self) -> None:
        """Publish what has come, without waiting (a death found here is raised at the next
        turn); nothing while a round trip or a failed step holds the messages."""
        if self.child.dead is None and not self.calling and self._failure is None:
            try:
                self._publish(0.0)
            except ReplicaDied:
                pass

    def call(
        self, msg: tuple, meanwhile: Callable[[], None] | None, after: Callable[[], None] | None
    ) -> Any:
        """One round trip: send, then publish the events that come before the reply;
        ``meanwhile`` runs every CALL_POLL_S of the wait, ``after`` once it has ended."""
        if self.child.dead is not None:
            raise ReplicaDied(self.child.dead)
        self.child.check()  # never send to a replica known to be silent
        self.calling = True
        try:
            self.child.link.send(msg)
            return self._await_reply(time.monotonic(), meanwhile)
        finally:
            self.calling = False
            if after is not None:
                after()

    def _publish(self, wait_s: float) -> None:
        """Publish what came after a failed step first, then the link's messages (the first
        waited for up to ``wait_s``), stopping at a failed step: its error is raised before
        the events that follow it (its requests' aborts) are heard."""
        while self._held and self._failure is None:
            self._take(self._held.popleft())
        while self._failure is None and not self._held:
            msg = self.child.link.next(wait_s)
            if msg is None:
                return
            wait_s = 0.0
            if msg[0] in ("reply", "refused"):  # never: every round trip takes its own reply
                log.warning("%s: a reply nobody waited for: %r", self.child.name, msg[0])
                continue
            self._take(msg)

    def _await_reply(self, sent: float, meanwhile: Callable[[], None] | None) -> Any:
        while True:
            msg = self.child.link.next(CALL_POLL_S)
            if msg is None:
                if meanwhile is not None:
                    meanwhile()
                self.child.check(sent)
                continue
            kind, value, load = msg
            self.load = load or self.load
            if kind == "reply":
                self.child.heard_from()
                return value
            if kind == "refused":
                raise ValueError(value)
            if self._failure is not None and msg is not CLOSED:  # held until it is raised
                self._held.append(msg)
            else:
                self._take(msg)

    def _take(self, msg: tuple) -> None:
        """A message that is not a reply: a step's events, a failed step, the pipe's end."""
        kind, value, load = msg
        if msg is CLOSED:
            self.child.ended()
        self.load = load or self.load
        self.child.heard_from()
        if kind == "failed":
            self._failure = value
            return
        self._deliver(value)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            why, self._failure = self._failure, None
            raise RuntimeError(f"{self.child.name}: a step failed: {why}")
