"""RayDisaggregatedFleet: disagg_fleet.py's prefill and decode engines as Ray actors, each
on a node that holds its role's custom resource, the KV moving through the object store.

    from minicb.fleet.ray.ray_disagg import RayDisaggregatedFleet
    with RayDisaggregatedFleet(prefill=1, decode=1, ray_address="auto") as fleet:
        outs = fleet.generate(["Hello"], SamplingParams(max_tokens=8))
        outs[0].transfer   # its KV's bytes, blocks and seconds through the object store

The coordinator (disagg_handoff.py), the schedulers (kv_transfer.py) and the roles
(kv_link.py, kv_receive.py) are the local fleet's; only where the engines run
(``RayReplica``) and the wire (object_link.py's ``RayGroup``) differ. The cluster must
offer the resources: a node started with ``--resources '{"prefill": 1}'`` for each prefill
engine, ``'{"decode": 1}'`` for each decode engine; without them the engines wait to be
placed, so the fleet refuses to start, naming the resource it lacks.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from minicb.fleet.disagg_fleet import DisaggregatedFleet
from minicb.fleet.ray.cluster import connect
from minicb.fleet.ray.object_link import RayGroup
from minicb.fleet.ray.ray_fleet import RayReplica


class RayDisaggregatedFleet(DisaggregatedFleet):
    """``RayDisaggregatedFleet(model=None, prefill=1, decode=1, ray_address=None,
    **options)``: DisaggregatedFleet's options."""

    replica_class = RayReplica

    def __init__(
        self,
        model: str | None = None,
        prefill: int = 1,
        decode: int = 1,
        *,
        ray_address: str | None = None,
        **options: Any,
    ) -> None:
        connect(ray_address)
        check_resources(prefill, decode)
        # actor names unique to this fleet: two fleets on one cluster never find each other
        self.make_group = functools.partial(RayGroup, prefix=f"minicb-{uuid.uuid4().hex[:8]}-")
        super().__init__(model, prefill, decode, **options)


def check_resources(prefill: int, decode: int) -> None:
    """ValueError, before any actor is made, when the cluster's nodes do not offer a unit of
    "prefill" for each prefill engine and of "decode" for each decode engine (else the
    engines would wait to be placed until the start timeout)."""
    import ray

    offered = ray.cluster_resources()
    for role, wanted in (("prefill", prefill), ("decode", decode)):
        if isinstance(wanted, int) and offered.get(role, 0) < wanted:
            raise ValueError(
                f"{wanted} {role} engines need {wanted} units of the custom resource "
                f"{role!r}, and the cluster's nodes offer {offered.get(role, 0):g}: start "
                f"nodes with ray start --resources '{{\"{role}\": 1}}'"
            )
