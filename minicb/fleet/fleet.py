"""Fleet: N replicas on this machine behind one router; the Python API and what
``minicb serve --replicas N`` routes through.

    from minicb.fleet import Fleet
    with Fleet(replicas=2, router="prefix-aware", dtype="float32") as fleet:
        outs = fleet.generate(["Hello", "The capital of France is"], SamplingParams(max_tokens=8))

Each replica is an engine in its own process (replica.py); the fleet holds their handles,
the ``Router`` (router.py) and one EngineLoop, whose thread is the only one that talks to
the replicas. A request sent to the fleet's name (``FLEET``) is routed in that thread, with
every replica's load as of its latest message; the decision is published, with its reason,
as a ``routed`` event on the chosen replica's bus, just before that replica's own events
for the request, so a page that draws the replicas side by side draws the router's reasons
beside them. From there on the request is that replica's: its stream, its abort (which
frees KV in that replica's pool), its metrics.

Each replica also publishes its KV events (the blocks its prefix cache stored and removed,
kv_events.py) on its own stream of the pipe (replica_link.py); before each decision the
fleet hands what came to the router's index (kv_index.py) and asks each replica the index
has lost track of (a gap, a restart) for a snapshot, which comes on the same stream a
moment later. The ``precise-prefix`` and ``cost`` routers read that index.

No replica can hold the others hostage (replica.py): each has its own I/O threads, a
round trip publishes the other replicas' events while it waits, and a replica silent for
``silent_after_s`` (3 s: it beats every 0.5 s) is out of rotation at once (``loads`` says
it is not alive) and declared dead at its next turn. A replica that dies is taken out of
the router's rotation (``Router.remove``) and its requests end with an error that names
it; they are not moved to another replica, because their clients have already been sent
part of the answer, which a sampled request would not repeat. The others go on. Then,
unless ``restart_replicas=False``, it is restarted: a fresh process under the same name,
back in rotation once its model is loaded (a replica whose restart fails stays dead). When
none serves, a request is refused with EngineStopped and /health answers 503 (both say
why: ``unavailable``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.request import RequestOutput
from minicb.driver.command_queue import EngineStopped
from minicb.driver.engine_loop import EngineLoop
from minicb.fleet.fleet_bus import FleetBus
from minicb.fleet.replica import SILENT_AFTER_S, Replica, ReplicaDied
from minicb.fleet.router import ReplicaLoad, Router

FLEET = "fleet"  # the name requests are sent to; the loop routes them to a replica


class Fleet:
    """``Fleet(model=None, replicas=2, router="round-robin", **engine_options)``."""

    # Each replica's handle: an engine in a local process; minicb/fleet/ray/ places them on
    # a Ray cluster with a handle of the same shape.
    replica_class: type[Replica] = Replica

    def __init__(
        self,
        model: str | None = None,
        replicas: int = 2,
        router: str = "round-robin",
        *,
        threads: int | None = None,
        restart_replicas: bool = True,
        silent_after_s: float = SILENT_AFTER_S,
        served_model_name: str | None = None,
        **options: Any,
    ) -> None:
        """``threads``: torch threads per replica (default: this process's, shared out);
        ``restart_replicas``: start a fresh process for a replica that died;
        ``silent_after_s``: how long a replica may send nothing before it is stalled;
        ``served_model_name``: what the fleet calls its model (default: ``model`` as given,
        or the default model's name; loader.model_name), never the folder it resolves to;
        ``options``: EngineConfig's, the same for every replica."""
        import torch

        from minicb.core.runner.loader import model_name, resolve_model_path

        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be a positive integer, got {replicas!r}")
        self.config = EngineConfig.from_kwargs(**options)
        self.model_name = model_name(model, served_model_name)
        self.router = Router(router, replicas, block_size=self.config.block_size)
        threads = threads or max(1, torch.get_num_threads() // replicas)
        path = str(resolve_model_path(model))
        config = _sharing_gpus(self.config, replicas)
        started = [
            self.replica_class(i, path, config, threads=threads, silent_after_s=silent_after_s)
            for i in self.router.replicas
        ]
        try:
            for replica in started:  # they load in parallel; wait for each in turn
                replica.ready()
        except BaseException:
            for replica in started:
                replica.close()
            raise
        self.replicas = {r.name: r for r in started}
        self._by_index = {r.index: r for r in started}
        self.restart_replicas = restart_replicas
        self._closing = False
        for replica in started:
            replica.on_death, replica.on_ready = self._taken_out, self._back
            replica.while_calling = functools.partial(self._meanwhile, replica)
        self.bus = FleetBus(started)
        self.clock = started[0].clock
        self._decisions = itertools.count()  # the router's own numbering of its decisions
        self._loop: EngineLoop | None = None
        self.max_in_flight: int | None = None  # limit_in_flight's

    # ---- engine-shaped, for the API routes ------------------------------------------------
    @property
    def policy(self) -> str:
        return self.router.policy

    @property
    def max_model_len(self) -> int:
        return self._first().max_model_len

    @property
    def tokenizer(self) -> Any:
        """Every replica's tokenizer, loaded in this process: the API's length rule reads
        its vocabulary (tokenizer_queue.py), as it does an engine's."""
        return self._first().tokenizer

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        return self._first().tokenize(prompt)  # in this process: every replica's tokenizer

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        return self._first().apply_chat_template(messages)

    def kv_snapshot(self) -> Any:
        """One live replica's pool (they are all alike): what the chat default reads."""
        return self._live()[0].kv_snapshot()

    def queue_sizes(self) -> dict[str, int]:
        """The live replicas' queues, added up."""
        total = {"waiting": 0, "running": 0, "swapped": 0}
        for replica in self._live():
            for key, value in replica.queue_sizes().items():
                total[key] += value
        return total

    # ---- routing (the engine thread) ------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> tuple[str, int]:
        """Route the request and queue it there; returns (the replica's name, the request's
        id in that replica). ValueError if the replica refuses it."""
        ids = self.tokenize(prompt) if prompt_token_ids is None else list(prompt_token_ids)
        now = self.clock() if arrival_time is None else arrival_time
        while True:
            self._hear_kv_events()
            try:
                route = self.router.route(next(self._decisions), ids, self._with_room())
            except RuntimeError as err:  # none is serving
                raise EngineStopped(self.unavailable() or f"no live replica: {err}") from err
            replica = self._by_index[route.replica]
            try:
                request_id = replica.add_request(
                    prompt, params, priority, arrival_time=now, prompt_token_ids=ids
                )
            except ReplicaDied:
                continue  # taken out of rotation as it died: route again
            if replica.bus.wants("routed"):
                replica.bus.emit(route.event(request_id, now))
            return replica.name, request_id

    def set_policy(self, policy: str) -> None:
        """Route from now on with ``policy``: a new router over the live replicas (its
        prefix record starts empty). Call it in the engine thread, or while it is idle."""
        router = Router(
            policy, max(self._by_index) + 1, block_size=self.config.block_size,
            index=self.router.index,  # what the replicas reported holds whatever the policy
        )  # fmt: skip
        for replica in self.replicas.values():
            if replica.dead is not None:
                router.remove(replica.index)
        self.router = router

    def _hear_kv_events(self) -> None:
        """The replicas' KV event records since the last decision, into the router's
        index; a snapshot asked of each replica the index lost track of."""
        index = self.router.index
        for replica in self.replicas.values():
            records = replica.child.link.kv_events
            while not records.empty():
                index.apply(replica.index, records.get_nowait())
        for lost in index.wanted(lambda i: i in self._by_index and self._by_index[i].serving):
            self._by_index[lost].child.link.send(("kv_snapshot",))

    def loads(self) -> list[ReplicaLoad]:
        """Each replica's load as of its latest message (swapped-out requests wait too);
        one that is not serving (dead, restarting, silent) is not alive to the router."""
        return [ReplicaLoad.of(r.index, r.load, r.serving) for r in self.replicas.values()]

    def limit_in_flight(self, max_in_flight: int) -> None:
        """Route only to replicas with fewer than ``max_in_flight`` open requests: the
        fair queue (minicb/server/tenant_gate.py) sends a request on only while the fleet
        has room, and this makes that room each replica's own."""
        self.max_in_flight = max_in_flight

    def _with_room(self) -> list[ReplicaLoad]:
        """The loads the router is told: a replica holding ``max_in_flight`` open requests
        is offered as not alive, unless every one is (then all are offered: a request that
        came without the fair queue, the Python API's, is never refused for room)."""
        loads = self.loads()
        if self.max_in_flight is None or self._loop is None:
            return loads
        held = self._loop.streams.by_engine
        full = {r.index for r in self.replicas.values()
                if len(held.get(r.name, ())) >= self.max_in_flight}  # fmt: skip
        roomy = [dataclasses.replace(x, alive=False) if x.replica in full else x for x in loads]
        return roomy if any(x.alive for x in roomy) else loads

    def health(self) -> dict[str, str]:
        """Each replica's state in words ("ok", or why it is out of rotation); any thread."""
        return {name: replica.health() for name, replica in self.replicas.items()}

    def unavailable(self) -> str | None:
        """Why no request could be served now (/health's 503), or None; any thread."""
        if any(replica.serving for replica in self.replicas.values()):
            return None
        return "no live replica: " + "; ".join(self.health().values())

    def _taken_out(self, replica: Replica) -> None:
        self.router.remove(replica.index)
        if self.restart_replicas and not self._closing:
            replica.restart()

    def _back(self, replica: Replica) -> None:
        self.router.rejoin(replica.index)

    def _meanwhile(self, calling: Replica) -> None:
        """While ``calling`` keeps a round trip waiting, the others' events go on."""
        for replica in self.replicas.values():
            if replica is not calling:
                replica.publish_waiting()

    def _first(self) -> Replica:
        return next(iter(self.replicas.values()))

    def _live(self) -> list[Replica]:
        live = [r for r in self.replicas.values() if r.serving]
        if not live:
            raise EngineStopped(self.unavailable() or "no live replica")
        return live

    # ---- the Python API -------------------------------------------------------------------
    def engine_loop(self) -> EngineLoop:
        """The loop that owns the replicas (one per fleet; the server starts it)."""
        if self._loop is None:
            self._loop = EngineLoop(dict(self.replicas), fleets={FLEET: self})
        return self._loop

    def generate(
        self,
        prompts: Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Complete every prompt, routed in order; outputs in the order of the prompts. A
        request on a replica that dies ends with finish reason "error" (its text says why)."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        loop = self.engine_loop()
        if not loop.alive:
            loop.start()
        work = functools.partial(asyncio.run, _generate(loop, list(prompts), list(params)))
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no event loop here: run one
            return work()
        # Called from a running event loop (a Jupyter cell): asyncio.run needs a thread
        with ThreadPoolExecutor(1, thread_name_prefix="minicb-fleet-generate") as pool:
            return pool.submit(work).result()

    def close(self) -> None:
        """Stop the loop's thread and every replica's process."""
        self._closing = True
        if self._loop is not None:
            self._loop.stop()
        for replica in self.replicas.values():
            replica.ask_to_stop()
        for replica in self.replicas.values():
            replica.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sharing_gpus(config: EngineConfig, replicas: int) -> EngineConfig:
    """Replicas take a GPU each in turn (replica_worker); where several share one and the
    KV pool is sized from free memory, each gets its share of the fraction: they start
    together, so each would otherwise see the same free memory and claim it all."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    per_gpu = -(-replicas // gpus) if gpus else 1
    if per_gpu > 1 and config.num_kv_blocks is None and config.device != "cpu":
        return config.with_(kv_memory_fraction=config.kv_memory_fraction / per_gpu)
    return config


async def _generate(
    loop: EngineLoop, prompts: list[str | list[int]], params: list[SamplingParams]
) -> list[RequestOutput]:
    streams = []
    try:
        for prompt, p in zip(prompts, params, strict=True):
            streams.append(await loop.submit(FLEET, prompt, p))
    except ValueError:
        for stream in streams:  # nothing half-done is left behind in the replicas
            await loop.abort(stream)
        raise
    outputs = []
    for stream in streams:
        async for item in stream:
            if isinstance(item, RequestOutput):
                outputs.append(item)
    return outputs
