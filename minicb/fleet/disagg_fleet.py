"""DisaggregatedFleet: P prefill engines and D decode engines, each a process of its own
with its own model copy and KV pool, the KV cache moving between them over torch.distributed.

    from minicb.fleet import DisaggregatedFleet
    with DisaggregatedFleet(prefill=1, decode=1, dtype="float32") as fleet:
        outs = fleet.generate(["Hello", "The capital of France is"], SamplingParams(max_tokens=8))
        outs[0].token_ids, outs[0].transfer   # bytes, blocks, seconds of its KV's move

The engines are replicas (replica.py, replica_worker.py) given a role (kv_link.py): their
schedulers are the simulated cluster's ``PrefillScheduler`` and ``DecodeScheduler``, so the
same decisions (a prefill engine holds the KV of a request after its first token; a decode
engine takes a request when its pool has room, else the request waits, its KV held on the
prefill side) run here on real engines and bytes. This object is the coordinator, in the
caller's thread (as the simulated cluster's event loop): it routes each request to a
prefill engine (the fleet's ``Router``, least loaded), told ``max_tokens=1``; when the
first token comes (from the prefill engine), it hands the request, prompt plus that token,
to a decode engine; when that engine has allocated blocks ("receiving"), it tells the
prefill engine to send; the decode engine lands the bytes and decodes to the end.

Every transfer is a ``kv_transfer`` event on the decode engine's bus (``bus``: every
engine's, as the fleet's): waiting (with the reason), receiving, done (bytes, seconds) or
failed. An abort on either side frees both sides' blocks. An engine that dies ends its
requests with an error naming it (``ReplicaDied``); a prefill engine whose peer died
mid-transfer says so, naming it, and frees the request's blocks.
"""

from __future__ import annotations

import functools
import itertools
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from minicb.config import EngineConfig, SamplingParams
from minicb.fleet.fleet import FleetBus
from minicb.fleet.kv_link import DecodeRole, Group, PrefillRole, private_store
from minicb.fleet.replica import Replica, ReplicaDied
from minicb.fleet.router import ReplicaLoad, Router

KINDS = ("tokens", "finished", "aborted", "kv_transfer")
FLEET = "fleet"  # the name the server's requests are sent to (as minicb.fleet.fleet's)


@dataclass
class Journey:
    """One request across the two engines (``state``: prefill, handed_off, receiving,
    decoding, done, error, aborted)."""

    id: int
    prompt: list[int]
    params: SamplingParams
    prefill: Replica
    prefill_id: int
    decode: Replica | None = None
    decode_id: int | None = None
    tag: int = 0  # its transfer's tag: the decode engine's receives match the sends by it
    token_ids: list[int] = field(default_factory=list)
    state: str = "prefill"
    held: bool = False  # its KV waits on the prefill side (sent or released: False)
    finish_reason: str | None = None
    error: str | None = None
    waiting: str | None = None  # why it once waited for room on the decode side
    transfer: dict[str, Any] | None = None  # the "done" event's blocks, bytes, seconds
    send_s: float | None = None  # the prefill engine's sends of its KV, seconds
    first: tuple[Any, float] | None = None  # its first token's delta and time (a stream's)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "error", "aborted")


@dataclass(frozen=True)
class Completion:
    """What ``generate`` gives back for one prompt."""

    token_ids: list[int]
    text: str
    finish_reason: str | None  # "stop", "length", "error" or "abort"
    error: str | None
    prefill: str
    decode: str | None
    transfer: dict[str, Any] | None
    waited: str | None


class DisaggregatedFleet:
    """``DisaggregatedFleet(model=None, prefill=1, decode=1, **engine_options)``."""

    def __init__(
        self,
        model: str | None = None,
        prefill: int = 1,
        decode: int = 1,
        *,
        decode_options: dict[str, Any] | None = None,
        threads: int = 1,
        transfer_timeout_s: float = 60.0,
        send_delay_s: float = 0.0,
        **options: Any,
    ) -> None:
        """``options``: EngineConfig's for every engine, ``decode_options`` overriding
        them on the decode side (its pool size, say); ``transfer_timeout_s``: the longest
        wait for a peer in one send or receive; ``send_delay_s``: a test's hook, a pause
        after each layer sent (so a kill can land mid-transfer)."""
        import torch

        from minicb.runner.loader import resolve_model_path
        from minicb.runner.tp_group import loopback_sockets

        for what, n in (("prefill", prefill), ("decode", decode)):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"{what} engines must be a positive integer, got {n!r}")
        self.config = EngineConfig.from_kwargs(**options)
        self.decode_config = self.config.with_(**(decode_options or {}))
        for name, config in (("prefill", self.config), ("decode", self.decode_config)):
            if config.batching != "continuous" or config.tensor_parallel_size != 1:
                raise ValueError(
                    f"disaggregated {name} engines run continuous batching on one rank each; "
                    f"got batching={config.batching!r}, "
                    f"tensor_parallel_size={config.tensor_parallel_size}"
                )
        if self.config.block_size != self.decode_config.block_size:
            raise ValueError("the prefill and decode engines must have the same block_size")
        world = prefill + decode
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        on_gpu = self.config.device != "cpu" and gpus > 0
        backend = "nccl" if on_gpu and gpus >= world else "gloo"  # NCCL: a GPU per rank
        names = tuple(
            [f"prefill{i}" for i in range(prefill)] + [f"decode{i}" for i in range(decode)]
        )
        loopback_sockets()  # before the engines start: they inherit the environment
        self._store, init = private_store()
        self.group = Group(init, world, backend, transfer_timeout_s, names)
        path = str(resolve_model_path(model))
        roles = [PrefillRole(self.group, r) for r in range(prefill)]
        roles += [DecodeRole(self.group, r) for r in range(prefill, world)]
        engines = []
        try:
            for rank, role in enumerate(roles):
                config = self.config if rank < prefill else self.decode_config
                engines.append(Replica(rank, path, config, threads=threads, role=role,
                                       name=names[rank]))  # fmt: skip
            for engine in engines:
                engine.ready()
        except BaseException:
            self._close(engines)
            raise
        self.prefill, self.decode = engines[:prefill], engines[prefill:]
        self.engines = {e.name: e for e in engines}
        self.bus = FleetBus(engines)
        self.send_delay_s = send_delay_s
        self._events: list[tuple[Replica, Any]] = []
        self._handling = False
        self._holding = False  # a request is being added: act once it is on record
        self._loop: Any = None  # the server's EngineLoop, once asked for (engine_loop)
        for engine in engines:  # before any other listener: a stream moves before it is fed
            engine.bus.subscribe(functools.partial(self._heard, engine), KINDS)
            engine.on_death = self._died
            engine.after_call = self._handle
        self.route_prefill = Router("least-loaded", prefill, block_size=self.config.block_size)
        self.route_decode = Router("least-loaded", decode, block_size=self.config.block_size)
        self.journeys: dict[int, Journey] = {}
        self._by_engine: dict[tuple[str, int], Journey] = {}
        self._ids = itertools.count()
        self._tags = itertools.count(1)

    # ---- requests ------------------------------------------------------------------------
    def submit(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> int:
        """Route the request to a prefill engine; returns its number in this fleet."""
        params = params or SamplingParams()
        ids = self.tokenize(prompt) if prompt_token_ids is None else list(prompt_token_ids)
        number = next(self._ids)
        route = self.route_prefill.route(number, ids, _loads(self.prefill))
        engine = self.prefill[route.replica]
        first = replace(params, max_tokens=1)  # the prompt and the first token
        # Its first token may come back during the next round trip to that engine: no
        # round trip before it is on record here (and in the engine's in-flight set).
        self._holding = True
        try:
            rid = engine.add_request(prompt, first, arrival_time=arrival_time,
                                     prompt_token_ids=ids)  # fmt: skip
        finally:
            self._holding = False
        journey = Journey(number, ids, params, engine, rid)
        self.journeys[number] = journey
        self._by_engine[(engine.name, rid)] = journey
        self._handle()
        return number

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> tuple[str, int]:
        """The server's door (as ``Fleet.add_request``): the prefill engine's name and the
        request's id there, where its stream starts (it moves to the decode engine)."""
        journey = self.journeys[self.submit(prompt, params, arrival_time, prompt_token_ids)]
        return journey.prefill.name, journey.prefill_id

    def abort_request(self, number: int) -> bool:
        """Stop it wherever it is; both sides' blocks are freed."""
        journey = self.journeys.get(number)
        if journey is None or journey.finished:
            return False
        journey.state = "aborted"
        if journey.decode is not None:
            journey.decode.abort_request(journey.decode_id)
        else:
            journey.prefill.abort_request(journey.prefill_id)
        # What the engines said before their answers: a first token (its KV now held
        # there), or a "receiving" (its bytes are sent, then dropped there).
        self._handle()
        self._release(journey)
        return True

    def step(self) -> None:
        """One turn: every engine's news, then what it calls for (hand-offs, sends)."""
        for engine in self.engines.values():
            if engine.dead is None:
                try:
                    engine.step()
                except ReplicaDied:
                    pass  # on_death (_died) has ended its requests
                except RuntimeError as err:  # a failed step: its requests end with it
                    self._failed(engine, str(err))
            self._handle()

    def has_unfinished(self) -> bool:
        return any(not j.finished for j in self.journeys.values())

    def generate(
        self,
        prompts: Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        timeout_s: float = 600.0,
    ) -> list[Completion]:
        """Complete every prompt; outputs in the order of the prompts."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        numbers = [self.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
        deadline = time.monotonic() + timeout_s
        while any(not self.journeys[n].finished for n in numbers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"requests unfinished after {timeout_s:.0f} s: {self._state()}")
            self.step()
        return [self.output(n) for n in numbers]

    def output(self, number: int) -> Completion:
        j = self.journeys[number]
        tokenizer = self.prefill[0].tokenizer
        text = tokenizer.decode(j.token_ids) if tokenizer is not None else ""
        reason = {"error": "error", "aborted": "abort"}.get(j.state, j.finish_reason)
        return Completion(
            list(j.token_ids),
            text,
            reason,
            j.error,
            j.prefill.name,
            j.decode.name if j.decode else None,
            j.transfer,
            j.waiting,
        )

    def kv_used(self) -> dict[str, int]:
        """Blocks in use in each live engine's pool (held KV included)."""
        return {n: e.kv_snapshot().num_used for n, e in self.engines.items() if e.dead is None}

    # ---- engine-shaped, for the server (as Fleet is) ---------------------------------------
    @property
    def replicas(self) -> dict[str, Replica]:
        return self.engines

    @property
    def model_name(self) -> str:
        return self.prefill[0].model_name

    @property
    def max_model_len(self) -> int:
        return min(self.prefill[0].max_model_len, self.decode[0].max_model_len)

    def clock(self) -> float:
        return self.prefill[0].clock()

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        return self.prefill[0].tokenize(prompt)  # in this process: every engine's tokenizer

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        return self.prefill[0].apply_chat_template(messages)

    def queue_sizes(self) -> dict[str, int]:
        total = {"waiting": 0, "running": 0, "swapped": 0}
        for engine in self.engines.values():
            for key, value in engine.queue_sizes().items():
                total[key] += value
        return total

    def kv_snapshot(self) -> Any:
        return self.prefill[0].kv_snapshot()

    def engine_loop(self) -> Any:
        """The server's loop over every engine, requests sent to ``FLEET`` routed here (a
        request's stream moves from its prefill engine to its decode engine)."""
        from minicb.server.engine_loop import EngineLoop

        if self._loop is None:
            self._loop = EngineLoop(dict(self.engines), fleets={FLEET: self})
        return self._loop

    # ---- what the engines' events call for -----------------------------------------------
    def _heard(self, engine: Replica, batch: list) -> None:
        """An engine's events, as they are published (in the thread that steps it): acted
        on at once, or, if they came during a round trip, when it has ended (``after_call``:
        a round trip to the same engine inside it would take its reply)."""
        self._events.extend((engine, event) for event in batch)
        if not any(e.calling for e in self.engines.values()):
            self._handle()

    def _handle(self) -> None:
        if self._handling or self._holding:
            return
        self._handling = True
        try:
            while self._events:
                self._act(*self._events.pop(0))
        finally:
            self._handling = False

    def _act(self, engine: Replica, event: Any) -> None:
        if event.kind == "tokens":
            for delta in event.deltas():
                journey = self._by_engine.get((engine.name, delta.request_id))
                if journey is not None and journey.state != "aborted":
                    journey.token_ids.append(delta.token_id)
                    if engine is journey.prefill and journey.first is None:
                        journey.first = (delta, event.time)
        elif event.kind == "aborted":  # by the server (a client hung up): free both
            journey = self._by_engine.get((engine.name, event.request_id))
            if journey is not None and not journey.finished:
                journey.state = "aborted"
                self._release(journey)
        elif event.kind == "finished":
            journey = self._by_engine.get((engine.name, event.request_id))
            if journey is not None:
                self._finished(journey, engine, event.finish_reason)
        else:
            self._transfer(engine, event)

    def _finished(self, journey: Journey, engine: Replica, finish_reason: str | None) -> None:
        if engine is journey.decode:
            if journey.state != "aborted":
                journey.state, journey.finish_reason = "done", finish_reason
            return
        # Its first token: a prefill engine holds the KV of a request stopped by length.
        journey.held = finish_reason == "length"
        if (
            journey.state == "aborted"
            or finish_reason != "length"
            or journey.params.max_tokens == 1
        ):
            if journey.state != "aborted":
                journey.state, journey.finish_reason = "done", finish_reason
            self._release(journey)
            return
        self._hand_off(journey)

    def _hand_off(self, journey: Journey) -> None:
        live = [e for e in self.decode if e.dead is None]
        if not live:
            return self._end(journey, "every decode engine has died")
        route = self.route_decode.route(journey.id, journey.prompt, _loads(self.decode))
        engine = self.decode[route.replica]
        ids = journey.prompt + journey.token_ids[:1]
        params = replace(journey.params, max_tokens=journey.params.max_tokens - 1)
        source = self.prefill.index(journey.prefill)
        journey.tag = next(self._tags)
        try:
            rid = engine.command("add_prefilled", ids, params, time.time(), source, journey.tag)
        except (ValueError, ReplicaDied) as err:
            return self._end(journey, f"{engine.name} refused it: {err}")
        journey.decode, journey.decode_id, journey.state = engine, rid, "handed_off"
        self._by_engine[(engine.name, rid)] = journey
        engine.in_flight.add(rid)  # the server's loop steps an engine that holds requests
        if self._loop is not None:  # its stream goes on there, with its first token
            stream = self._loop.move_stream(journey.prefill.name, journey.prefill_id,
                                            engine.name, rid)  # fmt: skip
            if stream is not None and journey.first is not None:
                stream.token(*journey.first)

    def _transfer(self, engine: Replica, event: Any) -> None:
        journey = self._by_engine.get((engine.name, event.request_id))
        if journey is None:
            return
        if event.status == "waiting":
            journey.waiting = event.reason
        elif event.status == "receiving":  # its blocks are allocated there: send now
            if journey.state != "aborted":
                journey.state = "receiving"
            self._send(journey, engine)
        elif event.status == "done":
            # seconds: from the receives' posting to the landing (the wait for the prefill
            # engine's turn included); send_seconds: the prefill engine's sends alone
            journey.transfer = {
                "blocks": event.blocks,
                "bytes": event.bytes,
                "seconds": event.seconds,
                "send_seconds": journey.send_s,
            }
            if journey.state == "receiving":
                journey.state = "decoding"
        elif event.status == "failed":
            self._end(journey, f"{engine.name}: {event.reason}")

    def _send(self, journey: Journey, decode: Replica) -> None:
        rank = len(self.prefill) + self.decode.index(decode)
        tokens = len(journey.prompt)
        try:
            sent = journey.prefill.command(
                "send_kv", journey.prefill_id, rank, journey.tag, tokens, self.send_delay_s
            )
            journey.send_s = sent["seconds"]
        except (ValueError, ReplicaDied) as err:
            journey.held = False  # the prefill engine freed them (or died with them)
            self._end(journey, str(err))
            if decode.dead is None and journey.decode_id is not None:
                try:
                    decode.abort_request(journey.decode_id)
                except RuntimeError:
                    pass
            return
        journey.held = False

    def _release(self, journey: Journey) -> None:
        if journey.held and journey.prefill.dead is None:
            journey.prefill.command("release", journey.prefill_id)
        journey.held = False

    def _end(self, journey: Journey, why: str) -> None:
        if not journey.finished:
            journey.state, journey.error = "error", why
            if self._loop is not None:
                where = journey.decode or journey.prefill
                rid = journey.decode_id if journey.decode else journey.prefill_id
                self._loop.end_stream(where.name, rid, why)
        self._release(journey)

    def _died(self, engine: Replica) -> None:
        """Its requests end with its words; those whose KV it was to receive are freed on
        the prefill side."""
        side, router = (
            (self.decode, self.route_decode) if engine in self.decode
            else (self.prefill, self.route_prefill)
        )  # fmt: skip
        router.remove(side.index(engine))
        for journey in list(self.journeys.values()):
            if journey.finished:
                continue
            on_it = journey.decode is engine or (journey.prefill is engine and not journey.decode)
            if on_it:
                self._end(journey, engine.dead or f"{engine.name} died")

    def _failed(self, engine: Replica, why: str) -> None:
        for journey in self.journeys.values():
            here = journey.decode is engine or (journey.prefill is engine and not journey.decode)
            if here and not journey.finished:
                self._end(journey, why)

    def _state(self) -> str:
        return ", ".join(f"{j.id}: {j.state}" for j in self.journeys.values() if not j.finished)

    # ---- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every engine's process."""
        if self._loop is not None:
            self._loop.stop()
        self._close(list(self.engines.values()))

    def _close(self, engines: list[Replica]) -> None:
        for engine in engines:
            engine.ask_to_stop()
        for engine in engines:
            engine.close()
        shutil.rmtree(self._store, ignore_errors=True)

    def __enter__(self) -> DisaggregatedFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _loads(engines: list[Replica]) -> list[ReplicaLoad]:
    return [
        ReplicaLoad(i, e.load["waiting"] + e.load["swapped"], e.load["running"], e.dead is None)
        for i, e in enumerate(engines)
    ]
