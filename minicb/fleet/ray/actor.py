"""A replica as a Ray actor: replica_worker.main in a thread, its pipe two queues.

A replica process (replica_worker.py) reads commands from a pipe and writes events to it;
an actor has no pipe to its driver, only method calls. So ``ActorPipe`` is the pipe's
replica end made of two queues, and the actor's methods are the wire: ``push`` puts one
command in, ``pull`` takes out what the replica sent (waiting a little for the first
message, so a driver that asks again at once does not spin). The loop itself, its
heartbeat thread and its messages are replica_worker's, unchanged.

The actor is threaded (``max_concurrency``): ``pull`` waits while ``push`` runs, and
``stopped`` waits for the loop's end, each in a thread of Ray's. Its calls are
authenticated as Ray's are (the cluster's token, where the cluster was started with one);
what travels is pickled by Ray, between the driver and its own actors only.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

ENDED = ("ended", None, None)  # pull's last message: the replica's loop has returned


class ActorPipe:
    """The replica's end of its pipe (``send``, ``poll``, ``recv``), made of two queues;
    the actor's ``push`` and ``pull`` are the other end."""

    def __init__(self) -> None:
        self.commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self.sent: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._next: tuple | None = None  # a command poll has seen and recv not yet taken

    def send(self, msg: tuple) -> None:
        self.sent.put(msg)

    def poll(self, timeout_s: float) -> bool:
        """Whether a command is waiting, waiting up to ``timeout_s`` for one."""
        if self._next is None:
            try:
                self._next = self.commands.get(timeout=timeout_s) if timeout_s > 0 else (
                    self.commands.get_nowait()
                )
            except queue.Empty:
                return False
        return True

    def recv(self) -> tuple:
        if self._next is None:
            self._next = self.commands.get()
        msg, self._next = self._next, None
        return msg


class ReplicaActor:
    """The actor's class (``ray.remote`` wraps it where it is placed: actor_process.py).
    Built, it starts the replica's loop, which loads the model and says "ready"."""

    def __init__(self, index: int, model: str, config: Any, threads: int, role: Any) -> None:
        from minicb.fleet import replica_worker

        self.pipe = ActorPipe()
        args = (self.pipe, index, model, config, threads, role)
        self.loop = threading.Thread(
            target=self._serve, args=(replica_worker.main, args), name="minicb-replica"
        )
        self.loop.start()

    def _serve(self, main: Any, args: tuple) -> None:
        try:
            main(*args)
        finally:
            self.pipe.send(ENDED)

    def push(self, msg: tuple) -> None:
        """One command for the replica's loop, in the order the driver sent it."""
        self.pipe.commands.put(msg)

    def pull(self, wait_s: float) -> list[tuple]:
        """What the replica sent since the last pull (its heartbeats too), waiting up to
        ``wait_s`` for the first message; ENDED is the last."""
        try:
            out = [self.pipe.sent.get(timeout=wait_s)]
        except queue.Empty:
            return []
        while out[-1] is not ENDED and not self.pipe.sent.empty():
            out.append(self.pipe.sent.get_nowait())
        return out

    def stopped(self, wait_s: float) -> bool:
        """Whether the replica's loop has returned, waiting up to ``wait_s`` for it."""
        self.loop.join(wait_s)
        return not self.loop.is_alive()

    def where(self) -> dict[str, Any]:
        """The node and process it runs in: the driver names them when it dies."""
        import ray

        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "pid": os.getpid()}

    def post(self, key: tuple[int, int], refs: list[Any]) -> None:
        """A peer's hand-off to this replica's role: the references to one layer's KV
        bytes in the object store (object_link.py). In a list, so Ray passes the reference
        on without fetching the bytes here and now."""
        from minicb.fleet.ray.object_link import MAILBOX

        MAILBOX.put(key, refs)
