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
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from minicb.core.request_events import KVTransfer
from minicb.core.runner.kv_pool import KVPool, copy_blocks
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.fleet.kv_transfer import DecodeScheduler, PrefillScheduler

POLL_S = 0.002  # how long a decode engine waiting for bytes waits for a command per turn


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
                    dist.send(data, dst, tag=tag)
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


class ReceivingScheduler(DecodeScheduler):
    """The decode scheduler of a real transfer: a transfer ends when its bytes are here
    (``landed``), not at a modelled time (its ``transfer_s`` says never)."""

    def landed(self, request_id: int) -> None:
        """Its KV is in its blocks: it joins the batch at the next step."""
        if request_id in self.receiving:
            self.receiving[request_id] = -math.inf


@dataclass
class Incoming:
    """One transfer being received: its receives, where they land, whence. A thread
    waits on the receives (a gloo receive says it has completed only once waited on), so
    the engine's loop goes on meanwhile and looks at ``arrived`` between turns."""

    source: int  # the prefill engine's rank
    tokens: int
    blocks: list[int]  # the request's first blocks here, one per block sent
    staging: KVPool
    works: list[Any]
    start: float
    arrived: threading.Event = field(default_factory=threading.Event)
    error: str | None = None  # why a receive failed (the peer died, or timed out)

    def __post_init__(self) -> None:
        threading.Thread(target=self._wait, daemon=True, name="minicb-kv-receive").start()

    def _wait(self) -> None:
        try:
            for work in self.works:
                work.wait()
        except RuntimeError as err:
            self.error = str(err).splitlines()[0] if str(err) else type(err).__name__
        self.arrived.set()


@dataclass
class DecodeRole:
    """A decode engine: requests arrive prefilled (``add_prefilled``), wait for room,
    receive their KV from the prefill engine's rank, then decode."""

    group: Group
    rank: int
    commands: frozenset[str] = frozenset({"add_prefilled"})
    sources: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (rank, tag)
    incoming: dict[int, Incoming] = field(default_factory=dict)
    told_waiting: set[int] = field(default_factory=set)

    def build(self, model: str, config: Any) -> Any:
        from minicb.core.engine import LLMEngine

        self.group.join(self.rank)
        self.name = self.group.names[self.rank]
        holder: list[Any] = []  # the engine, once built: on_transfer reads its pool

        def scheduler(*args: Any) -> ReceivingScheduler:  # kept: the role's side of it
            self.side = ReceivingScheduler(
                *args,
                clock=time.monotonic,
                transfer_s=lambda tokens: math.inf,  # until the bytes are here
                on_transfer=lambda rid, tokens, *_: self._receive(holder[0], rid, tokens),
            )
            return self.side

        holder.append(LLMEngine(model, config, scheduler=scheduler))
        return holder[0]

    def has_work(self, engine: Any) -> bool:
        """Whether a step has something to do: not while requests only wait for bytes (an
        empty step each turn would flood the fleet with step events)."""
        now = time.monotonic()
        when = self.side.next_step_time(now)
        return when is not None and when <= now

    def idle_wait_s(self) -> float:
        from minicb.fleet.replica_worker import IDLE_WAIT_S

        return POLL_S if self.incoming else IDLE_WAIT_S

    def command(self, engine: Any, msg: tuple) -> int:
        _, token_ids, params, arrival, source, tag = msg
        request_id = engine.add_request(
            token_ids, params, arrival_time=arrival, prompt_token_ids=list(token_ids)
        )
        self.sources[request_id] = (source, tag)
        return request_id

    def _emit(self, engine: Any, request_id: int, source: int, **fields: Any) -> None:
        engine.bus.emit(
            KVTransfer(
                time=engine.clock(),
                request_id=request_id,
                from_engine=self.group.names[source],
                to_engine=self.name,
                **fields,
            )
        )

    def _receive(self, engine: Any, request_id: int, tokens: int) -> None:
        """Blocks are allocated here: post the receives of the prompt's KV into staging."""
        source, tag = self.sources.pop(request_id)
        pool = engine.runner.kv_pool
        n = blocks_needed(tokens, engine.config.block_size)
        device = self.group.wire_device(pool)

        def like(part: torch.Tensor) -> torch.Tensor:  # n blocks of it
            return torch.empty(
                (part.shape[0], 2, n, *part.shape[3:]), dtype=part.dtype, device=device
            )

        staging = KVPool(tuple(like(part) for part in pool.parts), pool.kv_format)
        works = [
            dist.irecv(layer.view(torch.uint8), source, tag=tag)
            for part in staging.parts
            for layer in part
        ]
        blocks = engine.block_table(request_id)[:n]
        self.incoming[request_id] = Incoming(
            source, tokens, blocks, staging, works, time.perf_counter()
        )
        self.told_waiting.discard(request_id)
        reason = (
            f"{tokens} prompt tokens into {n} of its {len(engine.block_table(request_id))} blocks"
        )
        self._emit(
            engine,
            request_id,
            source,
            blocks=n,
            bytes=0,
            seconds=0.0,
            status="receiving",
            reason=reason,
        )

    @torch.inference_mode()
    def poll(self, engine: Any) -> None:
        """Land the transfers whose bytes have all arrived; say once why a request waits."""
        for request_id, inc in list(self.incoming.items()):
            if not inc.arrived.is_set():
                continue
            del self.incoming[request_id]
            if inc.error is not None:
                why = inc.error
                engine.abort_request(request_id)  # frees its blocks here
                self._emit(
                    engine,
                    request_id,
                    inc.source,
                    blocks=len(inc.blocks),
                    bytes=0,
                    seconds=time.perf_counter() - inc.start,
                    status="failed",
                    reason=f"the receive from {self.group.names[inc.source]} failed: {why}",
                )
                continue
            if request_id not in self.side.requests:
                continue  # aborted while its bytes were on their way: nothing to land
            copy_blocks(inc.staging, engine.runner.kv_pool, list(enumerate(inc.blocks)))
            self.side.landed(request_id)
            nbytes = sum(p.numel() * p.element_size() for p in inc.staging.parts)
            self._emit(
                engine,
                request_id,
                inc.source,
                blocks=len(inc.blocks),
                bytes=nbytes,
                seconds=time.perf_counter() - inc.start,
                status="done",
                reason=f"{inc.tokens} prompt tokens in {len(inc.blocks)} blocks",
            )
        self._tell_waiting(engine)

    def _tell_waiting(self, engine: Any) -> None:
        sched = self.side
        for req in sched.inbox:
            rid = req.request_id
            if rid in sched.refused and rid not in self.told_waiting:
                self.told_waiting.add(rid)
                need = blocks_needed(req.num_tokens, engine.config.block_size)
                busy = len(sched.running) + len(sched.receiving)
                why = (
                    f"all {engine.config.max_num_seqs} slots here are taken"
                    if busy >= engine.config.max_num_seqs
                    else f"needs {need} blocks here, {sched.blocks.num_free_blocks} free"
                )
                source = self.sources.get(rid, (0, 0))[0]
                self._emit(
                    engine,
                    rid,
                    source,
                    blocks=need,
                    bytes=0,
                    seconds=0.0,
                    status="waiting",
                    reason=f"waits on the prefill side (its KV stays there): {why}",
                )


def private_store() -> tuple[str, str]:
    """A directory only this user can read, and the file store's init method inside it."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="minicb-pd-")
    return folder, f"file://{os.path.join(folder, 'store')}"
