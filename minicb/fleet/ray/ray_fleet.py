"""RayFleet: fleet.py's ``Fleet`` with each replica a Ray actor placed on a cluster.

    from minicb.fleet.ray.ray_fleet import RayFleet
    with RayFleet(replicas=2, ray_address="auto", dtype="float32") as fleet:
        outs = fleet.generate(["Hello"], SamplingParams(max_tokens=8))

The router, the engine loop, the API and the page are the fleet's: only where a replica
runs differs (``RayReplica``: a ``Replica`` whose process is an actor, actor_process.py).
The model path is the driver's: every node must hold the model at that path (or the
default model's package, which resolves alike).

A replica whose actor or node dies is declared dead as a process is (fleet.py): it leaves
the router's rotation at once, its requests end with an error that names it and its node,
and the others go on. Its requests are not moved to another replica: their clients may
have been sent part of the answer already, and a sampled request would not repeat it. It
is restarted as a fresh actor (``restart_replicas``), which Ray places on a node that can
hold it: the same node if it lives, another if not.
"""

from __future__ import annotations

from typing import Any

from minicb.fleet.fleet import Fleet
from minicb.fleet.ray.actor_process import RayReplicaProcess
from minicb.fleet.ray.cluster import connect
from minicb.fleet.replica import Replica


class RayReplica(Replica):
    """A replica whose engine runs in a Ray actor: the same handle, the same messages."""

    process_class = RayReplicaProcess

    def node_id(self) -> str | None:
        """The Ray node its actor runs on (None until placed)."""
        return self.child.node_id()


class RayFleet(Fleet):
    """``RayFleet(model=None, replicas=2, router="round-robin", ray_address=None,
    **fleet_and_engine_options)``: joins the cluster (a local one when no address), then
    starts the replicas there."""

    replica_class = RayReplica

    def __init__(self, *args: Any, ray_address: str | None = None, **options: Any) -> None:
        connect(ray_address)
        super().__init__(*args, **options)
