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

Beside this file: disagg_engines.py (the processes and their group), disagg_handoff.py
(the journeys: hand-offs, sends and frees, driven by the engines' events) and
disagg_views.py (the fleet seen as one engine by the server).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from minicb.core.config import EngineConfig, SamplingParams
from minicb.fleet.disagg_engines import check_sizes, loads, start_engines, stop_engines
from minicb.fleet.disagg_handoff import Handoffs, Journey
from minicb.fleet.disagg_views import EngineShaped
from minicb.fleet.fleet_bus import FleetBus
from minicb.fleet.replica import ReplicaDied


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


class DisaggregatedFleet(EngineShaped, Handoffs):
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
        served_model_name: str | None = None,
        **options: Any,
    ) -> None:
        """``options``: EngineConfig's for every engine, ``decode_options`` overriding
        them on the decode side (its pool size, say); ``transfer_timeout_s``: the longest
        wait for a peer in one send or receive; ``send_delay_s``: a test's hook, a pause
        after each layer sent (so a kill can land mid-transfer); ``served_model_name``: what
        the fleet calls its model (default: ``model`` as given; loader.model_name)."""
        from minicb.core.runner.loader import model_name

        self.model_name = model_name(model, served_model_name)
        self.config = EngineConfig.from_kwargs(**options)
        self.decode_config = self.config.with_(**(decode_options or {}))
        check_sizes(prefill, decode, self.config, self.decode_config)
        engines, self._store = start_engines(
            model, prefill, decode, self.config, self.decode_config, threads, transfer_timeout_s
        )
        self.engines = {e.name: e for e in engines}
        self.bus = FleetBus(engines)
        Handoffs.__init__(
            self, engines[:prefill], engines[prefill:], self.config.block_size, send_delay_s
        )
        self._ids = itertools.count()

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
        route = self.route_prefill.route(number, ids, loads(self.prefill))
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
        # Not acted on here: the server opens its stream first (``add_request``); the
        # events wait for the next step, round trip or server round (module doc).
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
        request's id there, where its stream starts (it moves to the decode engine). Its
        journey is forgotten once it has finished (disagg_handoff.py)."""
        journey = self.journeys[self.submit(prompt, params, arrival_time, prompt_token_ids)]
        journey.streamed = True
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
        """Complete every prompt; outputs in the order of the prompts (their journeys are
        forgotten then; ``submit``'s own are kept until ``forget``)."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        numbers = [self.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
        deadline = time.monotonic() + timeout_s
        while any(not self.journeys[n].finished for n in numbers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"requests unfinished after {timeout_s:.0f} s: {self._state()}")
            self.step()
        outputs = [self.output(n) for n in numbers]
        for number in numbers:
            self.forget(number)
        return outputs

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

    # ---- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every engine's process."""
        if self._loop is not None:
            self._loop.stop()
        stop_engines(list(self.engines.values()), self._store)

    def __enter__(self) -> DisaggregatedFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
