"""A replica as the fleet's process sees it: an engine in another process, shaped like an
LLMEngine for the engine loop and the API routes.

Each replica is a whole engine (its own copy of the model, its own KV pool) in a process
of its own (replica_worker.py), started with torch.multiprocessing spawn, as the
tensor-parallel workers are. This handle keeps what the parent needs without asking: a
bus (the replica's events are re-published on it, in order, so the engine loop's streams,
the page's frames, the Prometheus metrics and the gate listen as they would to a local
engine), the tokenizer (prompts are tokenized here, in the server's tokenizer thread, with
LLMEngine's own ``tokenize``), and the replica's load as of its latest message (what the
router reads).

``step()`` is the engine loop's turn for this replica: it waits briefly for the replica's
next message and publishes what it carried; the replica steps on its own, in parallel
with the others. Requests, aborts and views are round trips, run in the engine thread.

A replica that dies (its process exits, or it sends nothing for ``stall_timeout_s`` while
it holds requests) raises ``ReplicaDied`` from ``step()``: the engine loop then ends each
of its requests with that error, as it does after a failed step, and ``on_death`` tells
the fleet, which takes it out of the router's rotation. Nothing waits on it after that.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from minicb.config import EngineConfig, SamplingParams
from minicb.engine import LLMEngine
from minicb.telemetry import events
from minicb.telemetry.bus import EventBus
from minicb.telemetry.kv_state import KVState

log = logging.getLogger(__name__)

STEP_WAIT_S = 0.01  # the engine loop's longest wait for one replica's message per round
STALL_TIMEOUT_S = 120.0  # silence, while it holds requests, after which a replica is dead
START_TIMEOUT_S = 600.0  # loading the model in a fresh process (a first run converts it)
FINISHING_KINDS = ("finished", "aborted")


class ReplicaDied(RuntimeError):
    """A replica's process died or stopped answering; the message names it."""


@dataclass(frozen=True)
class ReplicaModel:
    """What LLMEngine.tokenize reads from a runner: here, the replica's vocabulary size."""

    vocab_size: int


class Replica:
    """One replica's process and its engine-shaped handle (see the module doc)."""

    # The engine's own definitions, read against this handle's tokenizer and runner.
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
        role: Any = None,
        name: str | None = None,
    ) -> None:
        """Start the process (loading happens there); ``ready()`` waits for it. ``role``:
        what builds and extends its engine there (replica_worker's doc), ``name`` its name
        (default ``replica{index}``)."""
        import torch

        from minicb.fleet import replica_worker
        from minicb.runner.loader import load_tokenizer

        self.index, self.name, self.config = index, name or f"replica{index}", config
        self.stall_timeout_s = stall_timeout_s
        self.bus = EventBus()
        self.clock = time.time
        self.tokenizer = load_tokenizer(Path(model))
        self.on_death: Callable[[Replica], None] | None = None
        # Told when a round trip has ended (a fleet acts then on the events that came in
        # during it: a round trip of its own inside this one would take this one's reply).
        self.after_call: Callable[[], None] | None = None
        self.calling = False  # a round trip is under way
        self.dead: str | None = None  # why, once it has died
        self.in_flight: set[int] = set()  # its requests not finished or aborted yet
        self.load = {"waiting": 0, "running": 0, "swapped": 0}
        self._failure: str | None = None  # a failed step reported during a round trip
        self._heard = time.monotonic()  # when its latest message came
        self._info: dict[str, Any] = {}
        # The pool's map as the events published here say it is (see kv_snapshot_event).
        self._kv, self._steps = KVState(), 0
        ctx = torch.multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        args = (child, index, model, config, threads, role)
        self.process = ctx.Process(
            target=replica_worker.main, args=args, daemon=True, name=self.name
        )
        self.process.start()
        child.close()  # the child's end lives in the child: its exit closes the pipe

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> Replica:
        """Wait until the replica's engine is built; raises its error if it could not be."""
        ready = self._receive_reply(timeout_s)
        self._info = ready["describe"]
        self.runner = ReplicaModel(ready["vocab_size"])
        self.eos_token_ids = ready["eos_token_ids"]
        return self

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
        replica has died: its pool went with it)."""
        if self.dead is not None:
            return False
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
        return bool(self.in_flight)

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
        STEP_WAIT_S for something); raises ReplicaDied or a failed step's error."""
        self._raise_failure()
        if self.dead is not None:
            raise ReplicaDied(self.dead)
        wait([self._conn, self.process.sentinel], STEP_WAIT_S)
        while self._poll():
            self._take(self._recv())
            self._raise_failure()
        if not self.process.is_alive():
            self._die(self._exit_words())
        if self.in_flight and time.monotonic() - self._heard > self.stall_timeout_s:
            self._die(f"sent nothing for {self.stall_timeout_s:.0f} s while holding requests")

    def ask_to_stop(self) -> None:
        """Tell the process to leave (``close`` then waits for it): a fleet tells every
        replica first, so they shut down together."""
        if self.dead is None and self.process.is_alive() and not self._conn.closed:
            try:
                self._conn.send(("stop",))
            except OSError:
                pass

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the process to leave, and make sure it has."""
        if self._conn.closed:
            return
        self.ask_to_stop()
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout_s)
        self.dead = self.dead or f"{self.name} was shut down"
        self._conn.close()

    # ---- the pipe ------------------------------------------------------------------------
    def _view(self, name: str) -> Any:
        return self._call(("view", name))

    def _call(self, msg: tuple) -> Any:
        """One round trip: send, then publish the events that come before the reply."""
        if self.dead is not None:
            raise ReplicaDied(self.dead)
        self.calling = True
        try:
            try:
                self._conn.send(msg)
            except OSError:
                self._die(self._exit_words())
            return self._receive_reply(self.stall_timeout_s)
        finally:
            self.calling = False
            if self.after_call is not None:
                self.after_call()

    def _receive_reply(self, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._die(f"did not answer within {timeout_s:.0f} s")
            wait([self._conn, self.process.sentinel], left)
            if not self._poll():
                if not self.process.is_alive():
                    self._die(self._exit_words())
                continue
            kind, value, load = self._recv()
            self.load = load or self.load
            if kind == "reply":
                return value
            if kind == "refused":
                raise ValueError(value)
            self._take((kind, value, load))

    def _poll(self) -> bool:
        try:
            return self._conn.poll()
        except OSError:
            return False

    def _recv(self) -> tuple:
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            self.process.join(1.0)  # it is on its way out: let its exit code show
            self._die(self._exit_words())
        self._heard = time.monotonic()
        return msg

    def _take(self, msg: tuple) -> None:
        """A message that is not a reply: a step's events, or a failed step."""
        kind, value, load = msg
        self.load = load
        if kind == "failed":
            self._failure = value
            return
        for event in value:
            if event.kind in FINISHING_KINDS:
                self.in_flight.discard(event.request_id)
            if event.kind == "kv_changes":  # made between steps (an abort, a sent KV)
                self._kv.apply(event.kv_ops)
            elif isinstance(event, events.StepEvent):
                self._kv.apply(event.plan.kv_ops)
                self._steps = event.plan.step
        self.bus.emit_many(value)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            why, self._failure = self._failure, None
            raise RuntimeError(f"{self.name}: a step failed: {why}")

    def _exit_words(self) -> str:
        code = self.process.exitcode
        if code is None:
            how = "closed its pipe"
        elif code >= 0:
            how = f"exited with code {code}"
        else:
            how = f"was killed by signal {-code}"
        return f"{self.name} (pid {self.process.pid}) {how}"

    def _die(self, why: str) -> None:
        """Mark it dead (its requests end with ``why`` at the loop's next turn), stop the
        process if it is still there, tell the fleet, and raise."""
        if self.dead is None:
            self.dead = f"{why}; its requests end here, the other replicas go on"
            log.error("%s", self.dead)
            if self.process.is_alive():
                self.process.kill()
            if self.on_death is not None:
                self.on_death(self)
        raise ReplicaDied(self.dead)
