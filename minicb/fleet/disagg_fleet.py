"""DisaggregatedFleet: P prefill engines and D decode engines, each a process of its own
with its own model copy and KV pool, the KV cache moving between them over torch.distributed.

    from minicb.fleet import DisaggregatedFleet
    with DisaggregatedFleet(prefill=1, decode=1, dtype="float32") as fleet:
        outs = fleet.generate(["Hello", "The capital of France is"], SamplingParams(max_tokens=8))
        outs[0].token_ids, outs[0].transfer   # bytes, blocks, seconds of its KV's move

The engines are replicas (replica.py, replica_worker.py) given a role (kv_link.py,
kv_receive.py): their schedulers are the simulated cluster's ``PrefillScheduler`` and
``DecodeScheduler``, so the same decisions (a prefill engine holds the KV of a request
after its first token; a decode engine takes a request when its pool has room, else the
request waits, its KV held on the prefill side) run here on real engines and bytes. This
object is the coordinator, in the caller's thread (as the simulated cluster's event loop):
it routes each request to a prefill engine (the fleet's ``Router``, least loaded), told
``max_tokens=1``; when the first token comes (from the prefill engine), it hands the
request, prompt plus that token, to a decode engine; when that engine has allocated blocks
("receiving"), it tells the prefill engine to send; the decode engine lands the bytes and
decodes to the end.

Every transfer is a ``kv_transfer`` event on the decode engine's bus (``bus``: every
engine's, as the fleet's): waiting (with the reason), receiving, done (bytes, seconds) or
failed. An abort on either side frees both sides' blocks. An engine that dies ends its
requests with an error naming it (``ReplicaDied``); a prefill engine whose peer died
mid-transfer says so, naming it, and frees the request's blocks.

The fleet is also what the server's routes and its EngineLoop take for an engine (as
``Fleet`` is for replicas): its model's name is the one it was given (``model_name``), its
tokenizer and chat template are every engine's (the first prefill engine's, in this
process), the longest request is the shorter of the two sides', queue sizes add up every
engine's, and ``engine_loop`` is the server's one loop over every engine, requests sent to
``FLEET`` routed here.

Beside this file: disagg_engines.py (the processes and their group) and disagg_handoff.py
(``Handoffs``, its collaborator: the journeys, and the hand-offs, sends and frees that the
engines' events call for).
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
from minicb.fleet.fleet import FLEET  # the name the server's requests are sent to
from minicb.fleet.fleet_bus import FleetBus
from minicb.fleet.kv_link import Group
from minicb.fleet.replica import Replica, ReplicaDied


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

    # Where the engines run and how their KV travels: local processes over
    # torch.distributed; minicb/fleet/ray/ray_disagg.py: Ray actors, Ray's object store.
    replica_class: type[Replica] = Replica
    make_group: Any = staticmethod(Group)

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
            model, prefill, decode, self.config, self.decode_config, threads, transfer_timeout_s,
            replica_class=self.replica_class, make_group=self.make_group,
        )
        self.engines = {e.name: e for e in engines}
        self.prefill, self.decode = engines[:prefill], engines[prefill:]
        self.bus = FleetBus(engines)
        self.handoffs = Handoffs(self.prefill, self.decode, self.config.block_size, send_delay_s)
        self._ids = itertools.count()
        self._loop: Any = None  # the server's EngineLoop, once asked for (engine_loop)

    @property
    def journeys(self) -> dict[int, Journey]:
        """Every request in flight (and those ``submit`` kept), by its number here."""
        return self.handoffs.journeys

    # ---- engine-shaped, for the server -----------------------------------------------------
    @property
    def replicas(self) -> dict[str, Replica]:
        return self.engines

    @property
    def max_model_len(self) -> int:
        return min(self.prefill[0].max_model_len, self.decode[0].max_model_len)

    @property
    def tokenizer(self) -> Any:
        """Every engine's tokenizer, loaded in this process: the API's length rule reads
        its vocabulary (tokenizer_queue.py), as it does an engine's."""
        return self.prefill[0].tokenizer

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

    def health(self) -> dict[str, str]:
        """Each engine's state in words (Replica.health), for /health; any thread."""
        return {name: engine.health() for name, engine in self.engines.items()}

    def unavailable(self) -> str | None:
        """Why no request could be served now (/health's 503): a side with no engine
        serving; None while both have one."""
        for side, engines in (("prefill", self.prefill), ("decode", self.decode)):
            if not any(engine.serving for engine in engines):
                return f"no live {side} engine: " + "; ".join(e.health() for e in engines)
        return None

    def engine_loop(self) -> Any:
        """The server's loop over every engine, requests sent to ``FLEET`` routed here (a
        request's stream moves from its prefill engine to its decode engine). Before each
        of its rounds the hand-offs act on the engines' events of the last one: hand-offs,
        sends and frees happen there, once every listener has had the events."""
        from minicb.driver.engine_loop import EngineLoop

        if self._loop is None:
            self._loop = EngineLoop(dict(self.engines), fleets={FLEET: self},
                                    feeder=lambda _engines: self.handoffs.handle())  # fmt: skip
            self.handoffs.loop = self._loop
        return self._loop

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
        route = self.handoffs.route_prefill.route(number, ids, loads(self.prefill))
        engine = self.prefill[route.replica]
        first = replace(params, max_tokens=1)  # the prompt and the first token
        # Its first token may come back during the next round trip to that engine: no
        # round trip before it is on record here (and in the engine's in-flight set).
        self.handoffs.holding = True
        try:
            rid = engine.add_request(prompt, first, arrival_time=arrival_time,
                                     prompt_token_ids=ids)  # fmt: skip
        finally:
            self.handoffs.holding = False
        self.handoffs.register(Journey(number, ids, params, engine, rid))
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
        self.handoffs.handle()
        self.handoffs.release(journey)
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
                    self.handoffs.failed(engine, str(err))
            self.handoffs.handle()

    def has_unfinished(self) -> bool:
        return any(not j.finished for j in self.journeys.values())

    def generate(
        self,
        prompts: Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        timeout_s: float = 600.0,
    ) -> list[Completion]:
        """Complete every prompt; outputs in the order of the prompts (their journeys are
        forgotten then; ``submit``'s own are kept until ``handoffs.forget``)."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        numbers = [self.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
        deadline = time.monotonic() + timeout_s
        while any(not self.journeys[n].finished for n in numbers):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"requests unfinished after {timeout_s:.0f} s: {self.handoffs.state()}"
                )
            self.step()
        outputs = [self.output(n) for n in numbers]
        for number in numbers:
            self.handoffs.forget(number)
        return outputs

    def output(self, number: int) -> Completion:
        j = self.journeys[number]
        text = self.tokenizer.decode(j.token_ids) if self.tokenizer is not None else ""
        reason = {"error": "error", "aborted": "abort"}.get(j.state, j.finish_reason)
        return Completion(
            list(j.token_ids), text, reason, j.error, prefill=j.prefill.name,
            decode=j.decode.name if j.decode else None, transfer=j.transfer, waited=j.waiting,
        )  # fmt: skip

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
