"""The disaggregated fleet's engines: P prefill and D decode processes in one process group.

Rank r < P is a prefill engine ("prefill0", ...), the others decode engines ("decode0",
...); each is a replica process (replica.py) given its role (kv_link.py's PrefillRole,
kv_receive.py's DecodeRole), so it joins the group, builds its engine with its role's
scheduler and answers the transfer commands. The group meets through a file store in a
directory only this user can read, on loopback sockets (tp_group.py's rules): gloo on
CPU, NCCL when every rank has a GPU of its own.
DisaggregatedFleet (disagg_fleet.py) starts them here and stops them here.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from minicb.core.config import EngineConfig
from minicb.fleet.kv_link import Group, PrefillRole, private_store
from minicb.fleet.kv_receive import DecodeRole
from minicb.fleet.replica import Replica
from minicb.fleet.router import ReplicaLoad
from minicb.parallel.settings import ParallelSettings


def check_sizes(
    prefill: int, decode: int, config: EngineConfig, decode_config: EngineConfig
) -> None:
    """ValueError, before any process starts, for what the two sides cannot run."""
    for what, n in (("prefill", prefill), ("decode", decode)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{what} engines must be a positive integer, got {n!r}")
    for name, side in (("prefill", config), ("decode", decode_config)):
        ranks = ParallelSettings.of(side).tensor_parallel_size
        if side.batching != "continuous" or ranks != 1:
            raise ValueError(
                f"disaggregated {name} engines run continuous batching on one rank each; "
                f"got batching={side.batching!r}, tensor_parallel_size={ranks}"
            )
    if config.block_size != decode_config.block_size:
        raise ValueError("the prefill and decode engines must have the same block_size")


def start_engines(
    model: str | None,
    prefill: int,
    decode: int,
    config: EngineConfig,
    decode_config: EngineConfig,
    threads: int,
    transfer_timeout_s: float,
    *,
    replica_class: type[Replica] = Replica,
    make_group: Callable[..., Group] = Group,
) -> tuple[list[Replica], str]:
    """Every engine, started and its model loaded (prefill ranks first), and the group's
    store directory (``stop_engines`` removes it). ``replica_class`` and ``make_group``:
    where the engines run and how their KV travels (local processes over torch.distributed
    by default; minicb/fleet/ray/ passes Ray actors and its object store)."""
    import torch

    from minicb.core.runner.loader import resolve_model_path
    from minicb.parallel.tp_group import loopback_sockets

    world = prefill + decode
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    on_gpu = config.device != "cpu" and gpus > 0
    backend = "nccl" if on_gpu and gpus >= world else "gloo"  # NCCL: a GPU per rank
    names = tuple([f"prefill{i}" for i in range(prefill)] + [f"decode{i}" for i in range(decode)])
    loopback_sockets()  # before the engines start: they inherit the environment
    store, init = private_store()
    group = make_group(init, world, backend, transfer_timeout_s, names)
    path = str(resolve_model_path(model))
    roles: list[Any] = [PrefillRole(group, r) for r in range(prefill)]
    roles += [DecodeRole(group, r) for r in range(prefill, world)]
    engines: list[Replica] = []
    try:
        for rank, role in enumerate(roles):
            side = config if rank < prefill else decode_config
            engines.append(replica_class(rank, path, side, threads=threads, role=role,
                                         name=names[rank]))  # fmt: skip
        for engine in engines:
            engine.ready()
    except BaseException:
        stop_engines(engines, store)
        raise
    return engines, store


def stop_engines(engines: list[Replica], store: str) -> None:
    """Ask every engine to stop, then wait for each; the group's store goes with them."""
    for engine in engines:
        engine.ask_to_stop()
    for engine in engines:
        engine.close()
    shutil.rmtree(store, ignore_errors=True)


def loads(engines: list[Replica]) -> list[ReplicaLoad]:
    """One side's engines as the router sees them (their loads as of their latest message)."""
    return [ReplicaLoad.of(i, e.load, e.dead is None) for i, e in enumerate(engines)]
