"""A replica as the fleet's process sees it: an engine in another process, shaped like an
LLMEngine for the engine loop and the API routes.

Each replica is a whole engine in a process of its own; the process, its pipe and its life
(started, heard from, declared dead, restarted) are replica_process.py's. This handle keeps
what the parent needs without asking: a bus (the replica's events are re-published on it,
in order, so the engine loop's streams, the page's frames, the Prometheus metrics and the
gate listen as they would to a local engine), the tokenizer (prompts are tokenized here,
in the server's tokenizer thread, with LLMEngine's own ``tokenize``), the requests it holds,
the pool's map as its events say it is, and the replica's load as of its latest message
(what the router reads).

``step()`` is the engine loop's turn for this replica: it publishes what has come (waiting
up to STEP_WAIT_S); the replica steps on its own, in parallel with the others. Requests,
aborts and views are round trips in the engine thread: the command goes out, and the
thread waits for the reply, publishing the replica's events that come before it, and,
every CALL_POLL_S, the other replicas' events (``while_calling``), so their streams flow
while this one answers.

A dead replica's ``step()`` raises ``ReplicaDied`` once (the engine loop then ends each of
its requests with that error, naming it, as after a failed step) and ``on_death`` tells
the fleet, which takes it out of the router's rotation and may ``restart()`` it: a fresh
process under the same handle (same name, same bus, so every listener stays), which serves
again once its model is loaded (``on_ready``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minicb.core import events
from minicb.core.bus import EventBus
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.core.input_processor import InputProcessor
from minicb.fleet.replica_inbox import ReplicaInbox
from minicb.fleet.replica_process import (
    SILENT_AFTER_S,
    STALL_TIMEOUT_S,
    START_TIMEOUT_S,
    ReplicaDied,
    ReplicaProcess,
    idle_load,
)
from minicb.telemetry.kv_state import KVState


@dataclass(frozen=True)
class ReplicaModel:
    """What the server reads of an engine's runner, here: the replica's vocabulary size (the
    page's typed prompt is encoded within it)."""

    vocab_size: int


class Replica:
    """One replica's engine-shaped handle (see the module doc): ``child`` is its process,
    ``inbox`` what the process sends."""

    # What runs the engine and carries its messages: a local process here; a Ray actor in
    # minicb/fleet/ray/ (same commands, same events, so everything above it is unchanged).
    process_class: type[ReplicaProcess] = ReplicaProcess

    # The engine's own definitions, read against this handle's ``inputs`` (the tokenizer
    # here, the vocabulary size the replica said when it was ready).
    tokenize = LLMEngine.tokenize
    apply_chat_template = LLMEngine.apply_chat_template

    def __init__(
        self,
        index: int,
        model: str,
        config: EngineConfig,
        *,
        threads: int = 1,
        stall_timeout_s: float = STALL_TIMEOUT_S,
        silent_after_s: float = SILENT_AFTER_S,
        role: Any = None,
        name: str | None = None,
    ) -> None:
        """Start the process (loading happens there); ``ready()`` waits for it. ``role``:
        what builds and extends its engine there (replica_worker's doc), ``name`` its name
        (default ``replica{index}``)."""
        from minicb.core.runner.loader import load_tokenizer

        self.index, self.name, self.config = index, name or f"replica{index}", config
        self.bus = EventBus()
        self.clock = time.time
        self.tokenizer = load_tokenizer(Path(model))
        self.on_death: Callable[[Replica], None] | None = None
        self.on_ready: Callable[[Replica], None] | None = None  # back after a restart
        # Told when a round trip has ended (a fleet acts then on the events that came in
        # during it: a round trip of its own inside this one would take this one's reply).
        self.after_call: Callable[[], None] | None = None
        # Called every CALL_POLL_S while a round trip waits (the fleet's other replicas'
        # events are published then, so their streams never wait on this one).
        self.while_calling: Callable[[], None] | None = None
        self.in_flight: set[int] = set()  # its requests not finished or aborted yet
        self._info: dict[str, Any] = {}
        self._closed = False
        self._fresh_map()
        self.child = self.process_class(
            index, self.name, (model, config, threads, role),
            stall_timeout_s=stall_timeout_s, silent_after_s=silent_after_s,
            holding=lambda: bool(self.in_flight), died=self._died,
        )  # fmt: skip
        self.inbox = ReplicaInbox(self.child, self._deliver)

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> Replica:
        """Wait until the replica's engine is built; raises its error if it could not be."""
        self._take_ready(self.child.ready(timeout_s))
        return self

    def restart(self) -> None:
        """A fresh process under this handle, after a death (same name, same bus); the
        engine loop's turns (``step``) take its ready message, then it serves again."""
        self.child.restart()
        self._fresh_map()

    # ---- the process's state, as the fleet, /health and /metrics read it ------------------
    @property
    def dead(self) -> str | None:
        """Why it is out of service, while it is."""
        return self.child.dead

    @property
    def process(self) -> Any:
        return self.child.process

    @property
    def restarts(self) -> int:
        return self.child.restarts

    @property
    def load(self) -> dict[str, int]:
        return self.inbox.load

    @property
    def serving(self) -> bool:
        return self.child.serving

    def health(self) -> str:
        return self.child.health()

    # ---- what the engine loop and the routes call (the engine thread) ---------------------
    @property
    def model_name(self) -> str:
        return self._info["model"]

    @property
    def max_model_len(self) -> int:
        return self._info["max_model_len"]

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        expected_output_tokens: int | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> int:
        """Queue a request there; returns its id in that replica (ValueError if refused)."""
        arrival = self.clock() if arrival_time is None else arrival_time
        msg = ("add", prompt, params, priority, arrival, prompt_token_ids, expected_output_tokens)
        request_id = self._call(msg)
        self.in_flight.add(request_id)
        return request_id

    def abort_request(self, request_id: int) -> bool:
        """Abort it there, which frees its KV blocks in that replica's pool (False if the
        replica has died, before or during the call: its pool went with it)."""
        try:
            return self._call(("abort", request_id))
        except ReplicaDied:
            return False

    def abort_all(self) -> list[int]:
        if self.dead is not None:  # nothing is left there to abort: forget them
            ids, self.in_flight = sorted(self.in_flight), set()
            return ids
        return self._call(("abort_all",))

    def has_unfinished(self) -> bool:
        """Its requests, or something a turn must do: say a death, watch a restart, or
        declare a silence (an idle replica has turns too, so a stopped one is found)."""
        return bool(self.in_flight) or self.child.needs_turn

    def command(self, *msg: Any) -> Any:
        """One of its role's own commands (replica_worker's doc), as a round trip: the
        reply, or ValueError with the replica's words."""
        return self._call(msg)

    def queue_sizes(self) -> dict[str, int]:
        return dict(self.load)

    def describe(self) -> dict[str, Any]:
        if self.dead is not None:
            return {**self._info, "replica": self.index, "dead": self.dead}
        return {**self._view("describe"), "replica": self.index}

    def kv_snapshot(self) -> Any:
        return self._view("kv_snapshot")

    def kv_snapshot_event(self) -> events.KVSnapshotEvent:
        """The map as of the last event published on this bus, not as of the replica's
        latest step: a reader that subscribed a moment ago applies the steps after this
        map, so the map must not include a step whose event it will get too. Kept here
        from every step's ``kv_ops`` and every ``kv_changes`` (the replica starts empty);
        its pool is gone once it has died: an empty map."""
        kv = KVState() if self.dead is not None else self._kv
        return events.KVSnapshotEvent(
            time=self.clock(),
            step=self._steps,
            block_tables={rid: list(t) for rid, t in kv.block_tables.items()},
            swap_tables={rid: list(t) for rid, t in kv.swap_tables.items()},
            cached_blocks=kv.cached_blocks,
        )

    def live_requests(self) -> list[dict[str, Any]]:
        return [] if self.dead is not None else self._view("live_requests")

    def step(self) -> None:
        """Publish what the replica has sent since the last turn (waiting up to
        STEP_WAIT_S for something); raises ReplicaDied (once per death) or a failed
        step's error. While a restarted process loads, a turn only looks for its ready."""
        ready = self.inbox.turn()
        if ready is not None:
            self._back(ready)

    def publish_waiting(self) -> None:
        """Publish what has come, without waiting: its turn while the engine thread waits
        on another replica's round trip (a death found here is raised at its next step)."""
        self.inbox.publish_now()

    def ask_to_stop(self) -> None:
        """Tell the process to leave (``close`` then waits for it): a fleet tells every
        replica first, so they shut down together."""
        self.child.ask_to_stop()

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the process to leave, and make sure it has (at once if it is silent: a
        stopped process would not hear)."""
        if self._closed:
            return
        self._closed = True
        self.child.stop(timeout_s)

    # ---- what the process sends ------------------------------------------------------------
    def _view(self, name: str) -> Any:
        return self._call(("view", name))

    def _call(self, msg: tuple) -> Any:
        return self.inbox.call(msg, self.while_calling, self.after_call)

    def _deliver(self, batch: list) -> None:
        """A step's events (or changes made between steps), published here in order; the
        requests they end and the pool's map follow them."""
        for event in batch:
            if event.kind in ("finished", "aborted"):  # its request has ended
                self.in_flight.discard(event.request_id)
            if event.kind == "kv_changes":  # made between steps (an abort, a sent KV)
                self._kv.apply(event.kv_ops)
            elif isinstance(event, events.StepEvent):
                self._kv.apply(event.plan.kv_ops)
                self._steps = event.plan.step
        self.bus.emit_many(batch)

    def _fresh_map(self) -> None:
        """The pool's map as the events published here say it is (see kv_snapshot_event):
        empty, as a fresh process's pool is."""
        self._kv, self._steps = KVState(), 0

    def _take_ready(self, ready: dict[str, Any]) -> None:
        self._info = ready["describe"]
        self.runner = ReplicaModel(ready["vocab_size"])
        self.inputs = InputProcessor(self.tokenizer, ready["vocab_size"])
        self.eos_token_ids = ready["eos_token_ids"]

    def _back(self, ready: dict[str, Any]) -> None:
        """A restarted process is serving: it holds nothing yet, and numbers its requests
        from 0 again (a "reset" event says so to whoever listens)."""
        self._take_ready(ready)
        self.in_flight, self.inbox.load = set(), idle_load()
        if self.bus.wants("reset"):
            info = {**self._info, "replica": self.index}
            self.bus.emit(events.EngineReset(time=self.clock(), info=info))
        if self.on_ready is not None:
            self.on_ready(self)

    def _died(self) -> None:
        if self.on_death is not None:
            self.on_death(self)  # which may restart it: ``dead`` then says so
