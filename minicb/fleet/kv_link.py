"""Disaggregated serving, REAL: the prefill and decode engines' sides of a KV transfer over
torch.distributed point-to-point (gloo on CPU, NCCL where every engine has a GPU of its own).

Each engine is a replica process (replica_worker.py) given a role from here: the role
joins the engines' process group (a file store in a directory only this user can read,
sockets on loopback: tp_group.py's rules), builds the engine with its role's scheduler
(kv_transfer.py's ``PrefillScheduler`` and ``DecodeScheduler``: the same decisions as the
simulated cluster) and answers the fleet's transfer commands (disagg_handoff.py).

One transfer, in order:

1. the decode engine's scheduler finds room for a request handed to it (its ``_pull``):
   its blocks are allocated and ``on_transfer`` posts one ``irecv`` per layer (and per
   layer of 8-bit scales) into a staging pool the size of the prompt's blocks, then
   publishes a ``kv_transfer`` event, status "receiving";
2. the fleet sees it and tells the prefill engine to send (``send_kv``): the request's
   blocks of every layer, gathered from its pool (``pool[:, :, ids]``), one ``send`` per
   layer; then the prefill engine frees them (``PrefillScheduler.release``), whether the
   send worked or not, and says how many bytes, or why not, naming the decode engine;
3. between turns the decode engine looks at its receives (``poll``): once all have
   completed, the staging pool's blocks are copied into the request's own blocks with
   ``copy_blocks`` (the one way a block moves, scales with it), the request lands (it
   decodes at the next step) and a "done" event says how many bytes in how many seconds.
   A receive that failed (the prefill engine died) aborts the request here: "failed".

When the decode pool has no room the request waits in the decode scheduler's inbox and its
KV stays on the prefill side (``DecodeScheduler``'s backpressure); a "waiting" event says
why, once. The wire carries raw bytes (``uint8`` views), so any storage dtype travels.

Here: the engines' group, and the prefill engine's side (step 2: ``PrefillRole``); the
decode engine's side (steps 1 and 3: ``DecodeRole``) is kv_receive.py.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from minicb.core.runner.kv_pool import KVPool
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.fleet.kv_transfer import PrefillScheduler


@dataclass(frozen=True)
class Group:
    """The engines' process group: every prefill engine, then every decode engine."""

    init: str  # file:// store in a private directory
    world: int
    backend: str  # "gloo" or "nccl"
    timeout_s: float  # the longest wait for a peer in one send or receive
    names: tuple[str, ...]  # each rank's engine name ("prefill0", ..., "decode0", ...)

    def join(self, rank: int) -> None:
        dist.init_process_group(
            self.backend,
            init_method=self.init,
            rank=rank,
            world_size=self.world,
            timeout=timedelta(seconds=self.timeout_s),
        )

    def wire_device(self, pool: KVPool) -> torch.device:
        """Where the bytes travel from: the pool's device under NCCL, host memory (gloo)."""
        return pool.values.device if self.backend == "nccl" else torch.device("cpu")

    # The link itself, one layer's bytes at a time: the prefill side sends each layer in
    # order, the decode side posts one receive per layer in the same order. Another link
    # (minicb/fleet/ray/object_link.py: Ray's object store) overrides these two, ``join``
    # and ``wire_device``.
    def send(self, data: torch.Tensor, dst: int, tag: int) -> None:
        dist.send(data, dst, tag=tag)

    def irecv(self, buffer: torch.Tensor, src: int, tag: int) -> Any:
        """A receive into ``buffer``; its ``wait()`` returns once the bytes are there and
        raises RuntimeError if they never come (the peer died, or timed out)."""
        return dist.irecv(buffer, src, tag=tag)


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    """The same memory as bytes (contiguous): what a send or receive carries."""
    return tensor.contiguous().view(torch.uint8)


@dataclass
class PrefillRole:
    """A prefill engine: its scheduler keeps a request's KV after its first token until the
    fleet has it sent (``send_kv``) or released (``release``)."""

    group: Group
    rank: int
    commands: frozenset[str] = frozenset({"send_kv", "release"})

    def build(self, model: str, config: Any) -> Any:
        from minicb.core.engine import LLMEngine

        self.group.join(self.rank)

        def scheduler(*args: Any) -> PrefillScheduler:  # kept: the role's own side of it
            self.side = PrefillScheduler(*args)
            return self.side

        return LLMEngine(model, config, scheduler=scheduler)

    def has_work(self, engine: Any) -> bool:
        return engine.has_unfinished()

    def idle_wait_s(self) -> float:
        from minicb.fleet.replica_worker import IDLE_WAIT_S

        return IDLE_WAIT_S

    def poll(self, engine: Any) -> None:
        return None

    def command(self, engine: Any, msg: tuple) -> Any:
        if msg[0] == "release":
            freed = self.side.release(msg[1])
            engine.publish_kv_changes()  # the page's map loses the blocks now
            return freed
        _, request_id, dst, tag, tokens, delay_s = msg
        try:
            return self._send(engine, request_id, dst, tag, tokens, delay_s)
        finally:  # sent or not, the KV leaves this pool: the fleet does not ask twice
            self.side.release(request_id)
            engine.publish_kv_changes()

    @torch.inference_mode()
    def _send(
        self, engine: Any, request_id: int, dst: int, tag: int, tokens: int, delay_s: float
    ) -> dict:
        """Every layer's blocks of the request to rank ``dst``; ``delay_s``: a test's hook,
        a pause after each layer (so that a kill lands mid-transfer)."""
        pool = engine.runner.kv_pool
        n = blocks_needed(tokens, engine.config.block_size)
        ids = engine.block_table(request_id)[:n]
        if len(ids) < n:
            raise ValueError(f"request {request_id} holds {len(ids)} blocks here, not {n}")
        device = self.group.wire_device(pool)
        start, nbytes = time.perf_counter(), 0
        try:
            for part in pool.parts:
                for layer in part:  # (2, num_blocks, ...) -> the request's (2, n, ...)
                    data = _wire(layer[:, ids].to(device))
                    self.group.send(data, dst, tag)
                    nbytes += data.numel()
                    if delay_s:
                        time.sleep(delay_s)
        except RuntimeError as err:  # the peer died or stopped answering
            why = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(
                f"sending the KV of request {request_id} ({n} blocks) to "
                f"{self.group.names[dst]} (rank {dst}) failed after {nbytes} bytes: {why}; "
                f"its {len(engine.block_table(request_id))} blocks here are freed"
            ) from err
        return {"blocks": n, "bytes": nbytes, "seconds": time.perf_counter() - start}


def private_store() -> tuple[str, str]:
    """A directory only this user can read, and the file store's init method inside it."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="minicb-pd-")
    return folder, f"file://{os.path.join(folder, 'store')}"
