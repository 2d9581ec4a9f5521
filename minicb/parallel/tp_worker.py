"""A tensor-parallel worker (ranks 1..N-1): wait for a command from rank 0, run it, repeat.

The worker holds no scheduler, no requests and no sampler: only its shard of the weights
and its own paged KV cache per runner, with the same block ids as rank 0's. The commands
(sent by minicb.parallel.tp_group.TPGroup, in tp_messages.py's signed form):

- ``("open", handle, path, config, shared)``: build the shard of a runner (a new one, or
  one sharing the weights of runner ``shared``, as static batching shares continuous's),
  then tell rank 0 it is ready, or why it could not (``gather_statuses``: bytes, no
  pickle);
- ``("step", handle, plan)``: that runner's block copies and forward pass for the StepPlan
  (``ModelRunner.forward_pass``), all-reducing with the other ranks inside every layer;
- ``("stop",)``: leave.

Each command also carries the handles of runners rank 0 has dropped, closed first, and an
HMAC under the group's secret, checked before it is unpickled. When rank 0 dies, the next
wait fails (its sockets closed) and the worker exits.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from minicb.parallel.tensor_parallel import CollectiveTimer, Shard
from minicb.parallel.tp_messages import (
    CONTROL_TIMEOUT,
    gather_statuses,
    receive_object,
    wait_until_let_go,
)

log = logging.getLogger(__name__)


def main(
    rank: int,
    world: int,
    init: str,
    backend: str,
    timeout_s: float,
    threads: int,
    secret: bytes,
) -> None:
    """Entry point of a spawned worker process; ``secret`` signs rank 0's commands."""
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend, init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    serve(rank, world, dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT), secret)


def serve(rank: int, world: int, control: Any, secret: bytes) -> None:
    """The worker loop: until ``stop``, or until rank 0 is gone (or a command fails its
    signature check)."""
    # A spawned worker is a fresh interpreter: the features a shard's runner looks up must
    # register here as they did on rank 0, so that it attends, stores KV and holds its weights
    # as rank 0 does: the attention backends (kernels), the 8-bit KV formats (quant) and the
    # packed weights (packing; int8 weights and batch invariance refuse tensor parallelism).
    import minicb.kernels  # noqa: F401
    import minicb.packing  # noqa: F401
    import minicb.quant  # noqa: F401

    shard = Shard(rank, world, timer=CollectiveTimer())
    runners: dict[int, Any] = {}
    try:
        while True:
            msg, released = receive_object(control, secret)
            for handle in released:
                runners.pop(handle, None)
            if msg[0] == "stop":
                wait_until_let_go()  # else the exit after may abort (see there)
                break
            _run(msg, runners, shard, control)
    except RuntimeError as err:  # a peer is gone (rank 0 ended, or crashed), or a stranger
        log.warning("tensor-parallel rank %d stops: %s", rank, str(err).splitlines()[0])
        raise SystemExit(1) from err
    dist.destroy_process_group()


def _run(msg: tuple, runners: dict[int, Any], shard: Any, control: Any) -> None:
    kind, handle = msg[0], msg[1]
    if kind == "open":
        _, _, path, config, shared = msg
        model = runners[shared].model if shared is not None else None
        status = ""
        try:
            runners[handle] = _open(path, config, model, shard)
        except Exception as err:  # noqa: BLE001 - reported to rank 0, which raises it
            log.exception("tensor-parallel rank %d could not build its shard", shard.rank)
            status = f"{type(err).__name__}: {err}"
        gather_statuses(status, shard.world, control)
    elif kind == "step":
        runners[handle].forward_pass(msg[2])  # no sampling here: rank 0 holds the LM head
    else:
        raise ValueError(f"unknown tensor-parallel command {kind!r}")


def _open(path: str, config: Any, shared_model: Any, shard: Any) -> Any:
    """This rank's shard of a runner (on this rank's GPU where there is one): the model
    runner holding the ``shard`` as its part, as rank 0's holds its own (tp_runner.py)."""
    from minicb.core.runner.model_runner import ModelRunner

    if config.device != "cpu" and torch.cuda.is_available():
        config = config.with_(device=f"cuda:{torch.cuda.current_device()}")
    return ModelRunner(path, config, part=shard, shared_model=shared_model)
