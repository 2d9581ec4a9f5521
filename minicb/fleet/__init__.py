"""The fleet: several engines (replicas) behind one router.

One engine batches the requests it is given; a service runs several engines, each with its
own copy of the model and its own KV pool, and a router decides which engine gets each
request. ``router.py`` is that decision (round-robin, least-loaded as vLLM's data-parallel
coordinator scores load, prefix-aware as SGLang's cache-aware router), each with its reason
in words; the same ``Router`` decides for real replicas (processes behind the server) and
for simulated ones (engines on the simulated runner, at data-centre scale, on virtual
time). Pure Python here: the router never imports torch.

Real replicas on this machine: ``replica.py`` (``Replica``, an engine-shaped handle on an
engine in its own process; the process and its life in ``replica_process.py``, the
messages it sends in ``replica_inbox.py``, the pipe's threads in ``replica_link.py``, the
process's side in ``replica_worker.py``) and ``fleet.py`` (``Fleet``: the replicas, the
router and the engine loop that routes, one bus over them in ``fleet_bus.py``; ``minicb
serve --replicas N --router POLICY`` serves one). ``Fleet`` is imported on first use, so
that the router alone stays pure Python. Disaggregated prefill and decode, real:
``disagg_fleet.py`` (``DisaggregatedFleet``: P prefill and D decode engine processes, one
engine-shaped face for the server; its engines' group in ``disagg_engines.py``, the
requests' hand-offs in ``disagg_handoff.py``) and ``kv_link.py`` (their group and the
prefill side of a KV transfer over torch.distributed; the decode side in ``kv_receive.py``).
The router bench on real replicas through the API is the performance lab's
(perflab/chat_bench.py): it drives the whole server.

Many tenants sharing a fleet: ``tenancy/`` (API keys name tenants; a fair queue in front
of dispatch, by priority band and deficit round robin over uncached prompt tokens, with a
bounded queue and a token-rate limit per tenant; pure Python, used by the simulated fleet
and by the server, minicb/server/tenant_gate.py; ``python -m
minicb.fleet.tenancy.noisy_neighbour`` measures it).

Simulated replicas at data-centre scale (SIMULATED, virtual time, no torch):
``simulated.py`` (``SimulatedFleet``: engines on simulated GPUs behind the same router,
goodput under TTFT/TPOT targets, cost per million tokens), ``autoscale.py`` (when to add or
remove a replica, with its reason), ``fleet_reproductions.py`` and ``fleet_report.py`` (prefix-aware
against round-robin, replicas against one big batch, autoscaling against a doubled load, two
autoscalers on a ramp; ``minicb bench --simulate ... --reproduce router replicas autoscale
planner``). Disaggregated, simulated: ``kv_transfer.py`` (the two sides' schedulers and the
link, shared with the real fleet), ``disaggregated.py`` (the P+D cluster on virtual time, its
engines in ``disagg_member.py``; its pools sized apart by ``sla_planner.py``, Dynamo's SLA
planner from a performance model, or by ``pool_autoscale.py``, the queue-length autoscaler on
each pool), ``disagg_reproduction.py`` and ``disagg_report.py`` (DistServe's colocated against
disaggregated, ``python -m minicb.fleet.disagg_report``).
"""

from typing import Any

import minicb.features  # noqa: F401  (a product may run engines with any feature)


def __getattr__(name: str) -> Any:
    if name == "Fleet":
        from minicb.fleet.fleet import Fleet

        return Fleet
    if name == "DisaggregatedFleet":
        from minicb.fleet.disagg_fleet import DisaggregatedFleet

        return DisaggregatedFleet
    raise AttributeError(f"module 'minicb.fleet' has no attribute {name!r}")
