"""A replica's life on Ray: started as an actor, heard from, declared dead, restarted.

replica_process.py's ``ReplicaProcess`` keeps a replica's life (its silence, its stalls,
its death in words, its restart); only how the engine is started differs here: Ray places
a ``ReplicaActor`` (actor.py) on a node and the link talks to it through
``ActorConnection`` (actor_connection.py). Where it goes: a plain replica anywhere, spread
over the nodes in turn (``spread``: one node's loss takes as few replicas as it can); a role's
engine on a node that holds its custom resource (object_link.py's ``RayGroup``).

Its death is the same as a process's, read from Ray: the actor killed, its worker process
gone, its node gone all fail the link's calls (``RayActorError``), the link ends, and the
replica is declared dead with Ray's words and the node it was on. A restart is a fresh
actor, wherever Ray places it then (another node, if its own is gone).
"""

from __future__ import annotations

import time
from typing import Any

from minicb.fleet.ray.actor import ReplicaActor
from minicb.fleet.ray.actor_connection import ActorConnection
from minicb.fleet.replica_link import ReplicaLink
from minicb.fleet.replica_process import ReplicaProcess

ACTOR_THREADS = 4  # pull, push, stopped and a peer's post may wait at the same time


def spread(index: int) -> dict[str, Any]:
    """Where replica ``index`` goes: the alive nodes in turn, in the order of their ids, and
    softly (a node that cannot hold it lets Ray place it elsewhere, as after a node's loss).
    Not Ray's own "SPREAD" strategy: that is best effort across everything the cluster
    schedules, and with other actors coming and going it put both of two replicas on one
    node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))
    node = nodes[index % len(nodes)]
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=True)}


class ActorProcess:
    """The part of a ``multiprocessing.Process`` that ReplicaProcess uses, for an actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.killed = False
        self.exitcode = None  # an actor has none: its end is in Ray's words (ended_why)
        self._where_ref = actor.where.remote()
        self._where: dict[str, Any] | None = None

    def where(self) -> dict[str, Any] | None:
        """Its node and pid, once the actor has been placed (None before, or if it died
        before saying)."""
        import ray

        if self._where is None:
            ready, _ = ray.wait([self._where_ref], timeout=0)
            if ready:
                try:
                    self._where = ray.get(self._where_ref)
                except ray.exceptions.RayError:
                    return None
        return self._where

    @property
    def pid(self) -> int | None:
        where = self.where()
        return None if where is None else where["pid"]

    def is_alive(self) -> bool:
        return not self.killed

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the replica's loop to return (told to stop)."""
        import ray

        try:
            ray.get(self.actor.stopped.remote(timeout_s), timeout=timeout_s + 5.0)
        except ray.exceptions.RayError:
            pass  # dead already, or unreachable: kill() settles it

    def kill(self) -> None:
        import ray

        self.killed = True
        try:
            ray.kill(self.actor, no_restart=True)
        except ray.exceptions.RayError:
            pass


class RayReplicaProcess(ReplicaProcess):
    """ReplicaProcess with its engine in a Ray actor (see the module doc)."""

    def start(self) -> None:
        import ray

        model, config, threads, role = self._spawn
        placement = spread(self.index) if role is None else role.group.actor_options(role.rank)
        remote = ray.remote(ReplicaActor).options(
            max_concurrency=ACTOR_THREADS, max_restarts=0, num_cpus=1, **placement
        )
        actor = remote.remote(self.index, model, config, threads, role)
        self.process = ActorProcess(actor)
        self.connection = ActorConnection(actor)
        self.link = ReplicaLink(self.connection, self.name)  # type: ignore[arg-type]
        self._started = self._stepped = time.monotonic()

    def node_id(self) -> str | None:
        """The Ray node it runs on (None until placed)."""
        where = self.process.where()
        return None if where is None else where["node_id"]

    def _exit_words(self) -> str:
        where = self.process.where() or {}
        at = f"pid {where.get('pid')} on Ray node {str(where.get('node_id'))[:12]}"
        why = self.connection.ended_why or "its link ended"
        return f"{self.name} ({at}) ended: {why}"
