"""Disaggregated serving, REAL: the decode engine's side of a KV transfer.

kv_link.py tells one transfer in order; here are steps 1 and 3. The decode engine's
scheduler finds room for a request handed to it (``add_prefilled``), its blocks are
allocated, and ``_receive`` posts one ``irecv`` per layer (and per layer of 8-bit scales)
into a staging pool the size of the prompt's blocks (a "receiving" event). A thread waits
on the receives (``Incoming``), so the engine's loop goes on; between turns ``poll`` lands
the transfers whose bytes have all arrived: the staging pool's blocks are copied into the
request's own blocks with ``copy_blocks`` (the one way a block moves, scales with it), the
request decodes at the next step, and a "done" event says how many bytes in how many
seconds. A receive that failed (the prefill engine died) aborts the request here:
"failed". A request that waits for room is told once ("waiting": its KV stays on the
prefill side).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from minicb.core.request_events import KVTransfer
from minicb.core.runner.kv_pool import KVPool, copy_blocks
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.fleet.kv_link import Group
from minicb.fleet.kv_transfer import DecodeScheduler

POLL_S = 0.002  # how long a decode engine waiting for bytes waits for a command per turn


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
            self.group.irecv(layer.view(torch.uint8), source, tag)
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
