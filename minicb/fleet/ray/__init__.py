"""Replicas and prefill/decode roles placed on a Ray cluster (``pip install 'minicb[ray]'``).

The replicas of ``fleet.py`` are processes on this machine. Here each one is a Ray actor,
placed by Ray on any node of a cluster, that runs the very same replica loop
(replica_worker.py) and so speaks the same commands and events: the router, the fleet, the
engine loop, the API and the page see the same ``Replica`` handle and cannot tell.

- ``cluster.py``: joining a cluster (an address, or a local one started here);
- ``actor.py``: the actor (``ReplicaActor``) and its side of the message queues
  (``ActorPipe``), where replica_worker.main runs in a thread;
- ``actor_connection.py``: the fleet's side of those queues, shaped like the end of a pipe,
  so replica_link.py's reader and writer threads use it unchanged;
- ``actor_process.py``: a replica's life on Ray (``RayReplicaProcess``): started as an
  actor, heard from, declared dead when the actor or its node dies, restarted as a fresh
  actor, wherever Ray places it;
- ``ray_fleet.py``: ``RayFleet`` (``minicb serve --replicas N --fleet ray``);
- ``object_link.py``: the KV hand-off of disaggregated serving through Ray's object store,
  a third link beside gloo (kv_link.py) and the host tier; ``ray_disagg.py`` places the
  prefill and decode roles on the nodes that hold their custom resources.

This package's ``__init__`` imports nothing, and no module here imports ray at import
time: a machine without the extra can import the fleet's code and its tests skip.
"""
