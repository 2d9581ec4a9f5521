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

The pipe has its own reader and writer threads (replica_link.py): the engine thread never
waits in ``send`` or ``recv``. ``step()`` is the engine loop's turn for this replica: it
publishes what has come (waiting up to STEP_WAIT_S); the replica steps on its own, in
parallel with the others. Requests, aborts and views are round trips in the engine
thread: the command goes out, and the thread waits for the reply, publishing the
replica's events that come before it, and, every CALL_POLL_S, the other replicas' events
(``while_calling``), so their streams flow while this one answers. A round trip still
waits for the replica's current step (its engine runs commands between steps): while the
replica is heard from, up to ``stall_timeout_s``; once it falls silent, no longer.

When is a replica gone? Once ready it says "alive" every HEARTBEAT_S (0.5 s), from a
thread of its own, whatever its engine is doing. So:

- silent for ``silent_after_s`` (SILENT_AFTER_S, 3 s: six heartbeats missed): stopped
  (SIGSTOP, a debugger), frozen or gone. From that moment it is not ``serving`` (the
  router passes it by, /health and /metrics name it), and the next turn or round trip
  declares it dead;
- beating, but no step finished for ``stall_timeout_s`` while it holds requests, or no
  reply in that time: hung inside a step (a GPU that never returns);
- its process exited (the pipe ended).

A dead replica's process is killed; ``step()`` raises ``ReplicaDied`` once (the engine loop
then ends each of its requests with that error, naming it, as after a failed step) and
``on_death`` tells the fleet, which takes it out of the router's rotation and may
``restart()`` it: a fresh process under the same handle (same name, same bus, so every
listener stays), which serves again once its model is loaded (``on_ready``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minicb.core import events
from minicb.core.bus import EventBus
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.engine import LLMEngine
from minicb.fleet.replica_link import CLOSED, ReplicaLink
from minicb.telemetry.kv_state import KVState

log = logging.getLogger(__name__)

STEP_WAIT_S = 0.01  # the engine loop's longest wait for one replica's message per round
CALL_POLL_S = 0.05  # how often a round trip looks up from its wait (others' events, silence)
SILENT_AFTER_S = 3.0  # no message at all (heartbeats every 0.5 s) for this long: stalled
STALL_TIMEOUT_S = 120.0  # beating, but no step nor reply for this long while needed: hung
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
        silent_after_s: float = SILENT_AFTER_S,
        role: Any = None,
        name: str | None = None,
    ) -> None:
        """Start the process (loading happens there); ``ready()`` waits for it. ``role``:
        what builds and extends its engine there (replica_worker's doc), ``name`` its name
        (default ``replica{index}``)."""
        from minicb.core.runner.loader import load_tokenizer

        self.index, self.name, self.config = index, name or f"replica{index}", config
        self.stall_timeout_s, self.silent_after_s = stall_timeout_s, silent_after_s
        self._spawn = (model, config, threads, role)
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
        self.calling = False  # a round trip is under way
        self.dead: str | None = None  # why it is out of service, while it is
        self.died_of: str | None = None  # its latest death, in words
        self.starting = False  # a restarted process is loading its model
        self.restarts = 0
        self.in_flight: set[int] = set()  # its requests not finished or aborted yet
        self.load = {"waiting": 0, "running": 0, "swapped": 0}
        self._failure: str | None = None  # a failed step not raised from step() yet
        self._held: deque[tuple] = deque()  # what came after that failure, in order
        self._death: str | None = None  # a death not raised from step() yet
        self._info: dict[str, Any] = {}
        self._closed = False
        self._start()

    def _start(self) -> None:
        import torch

        from minicb.fleet import replica_worker

        model, config, threads, role = self._spawn
        ctx = torch.multiprocessing.get_context("spawn")
        conn, child = ctx.Pipe()
        args = (child, self.index, model, config, threads, role)
        self.process = ctx.Process(
            target=replica_worker.main, args=args, daemon=True, name=self.name
        )
        self.process.start()
        child.close()  # the child's end lives in the child: its exit closes the pipe
        self.link = ReplicaLink(conn, self.name)
        self._started = self._stepped = time.monotonic()  # _stepped: its latest step or reply
        # The pool's map as the events published here say it is (see kv_snapshot_event).
        self._kv, self._steps = KVState(), 0

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> Replica:
        """Wait until the replica's engine is built; raises its error if it could not be."""
        deadline = time.monotonic() + timeout_s
        while (msg := self.link.next(min(1.0, max(deadline - time.monotonic(), 0)))) is None:
            if time.monotonic() > deadline:
                self._die(f"{self.name} did not start within {timeout_s:.0f} s")
        self._take_ready(msg)
        return self

    def restart(self) -> None:
        """A fresh process under this handle, after a death (same name, same bus); the
        engine loop's turns (``step``) take its ready message, then it serves again."""
        self._kill()
        self.link.close()
        self.restarts += 1
        self.starting = True
        self.dead = f"restarting (restart {self.restarts}) after: {self.died_of}"
        log.warning("%s: starting a fresh process (restart %d)", self.name, self.restarts)
        self._start()

    @property
    def serving(self) -> bool:
        """Whether requests may be sent here: ready, not dead, heard from lately."""
        return self.dead is None and self.link.silent_s() <= self.silent_after_s

    def health(self) -> str:
        """Its state in words, for /health: "ok", or why it is out of rotation."""
        if self.dead is not None:
            return self.dead
        silent = self.link.silent_s()
        if silent > self.silent_after_s:
            return (
                f"{self.name} (pid {self.process.pid}) sent nothing, not even its heartbeat, "
                f"for {silent:.1f} s (the bound is {self.silent_after_s:g} s): out of rotation"
            )
        return "ok"

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
        """Its requests, or something a turn must do: say a death, watch a restart, or
        declare a silence (an idle replica has turns too, so a stopped one is found)."""
        return (
            bool(self.in_flight)
            or self._death is not None
            or self.starting
            or (self.dead is None and self.link.silent_s() > self.silent_after_s)
        )

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
        try:
            self._turn()
        except ReplicaDied:
            self._death = None  # said now: the engine loop ends its requests with it
            raise

    def publish_waiting(self) -> None:
        """Publish what has come, without waiting: its turn while the engine thread waits
        on another replica's round trip (a death found here is raised at its next step)."""
        if self.dead is None and not self.calling and self._failure is None:
            try:
                self._publish(0.0)
            except ReplicaDied:
                pass

    def ask_to_stop(self) -> None:
        """Tell the process to leave (``close`` then waits for it): a fleet tells every
        replica first, so they shut down together."""
        if not self.link.closed:
            self.link.send(("stop",))

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the process to leave, and make sure it has (at once if it is silent: a
        stopped process would not hear)."""
        if self._closed:
            return
        self._closed = True
        self.ask_to_stop()
        silent = self.link.silent_s() > self.silent_after_s
        self.process.join(0 if silent else timeout_s)
        self._kill()
        self.dead = self.dead or f"{self.name} was shut down"
        self.starting = False
        self.link.close()

    # ---- the pipe ------------------------------------------------------------------------
    def _view(self, name: str) -> Any:
        return self._call(("view", name))

    def _turn(self) -> None:
        if self._death is not None:
            raise ReplicaDied(self._death)
        if self.starting:
            return self._watch_start()
        self._raise_failure()
        if self.dead is not None:
            raise ReplicaDied(self.dead)
        self._publish(STEP_WAIT_S)
        self._raise_failure()
        self._check()

    def _publish(self, wait_s: float) -> None:
        """Publish what came after a failed step first, then the link's messages (the first
        waited for up to ``wait_s``), stopping at a failed step: its error is raised before
        the events that follow it (its requests' aborts) are heard."""
        while self._held and self._failure is None:
            self._take(self._held.popleft())
        while self._failure is None and not self._held:
            msg = self.link.next(wait_s)
            if msg is None:
                return
            wait_s = 0.0
            if msg[0] in ("reply", "refused"):  # never: every round trip takes its own reply
                log.warning("%s: a reply nobody waited for: %r", self.name, msg[0])
                continue
            self._take(msg)

    def _call(self, msg: tuple) -> Any:
        """One round trip: send, then publish the events that come before the reply."""
        if self.dead is not None:
            raise ReplicaDied(self.dead)
        self._check()  # never send to a replica known to be silent
        self.calling = True
        try:
            self.link.send(msg)
            return self._await_reply(time.monotonic())
        finally:
            self.calling = False
            if self.after_call is not None:
                self.after_call()

    def _await_reply(self, sent: float) -> Any:
        while True:
            msg = self.link.next(CALL_POLL_S)
            if msg is None:
                if self.while_calling is not None:
                    self.while_calling()
                self._check(sent)
                continue
            kind, value, load = msg
            self.load = load or self.load
            if kind == "reply":
                self._stepped = time.monotonic()
                return value
            if kind == "refused":
                raise ValueError(value)
            if self._failure is not None and msg is not CLOSED:  # held until it is raised
                self._held.append(msg)
            else:
                self._take(msg)

    def _check(self, call_sent: float | None = None) -> None:
        """Declare it dead if its process has gone quiet, hung or ended."""
        silent = self.link.silent_s()
        if silent > self.silent_after_s:
            self._die(
                f"{self.name} (pid {self.process.pid}) sent nothing, not even its heartbeat, "
                f"for {silent:.1f} s (the bound is {self.silent_after_s:g} s)"
            )
        now = time.monotonic()
        if call_sent is not None and now - call_sent > self.stall_timeout_s:
            self._die(f"{self.name} did not answer within {self.stall_timeout_s:.0f} s")
        if self.in_flight and now - self._stepped > self.stall_timeout_s:
            self._die(
                f"{self.name} finished no step for {self.stall_timeout_s:.0f} s while "
                "holding requests"
            )

    def _take(self, msg: tuple) -> None:
        """A message that is not a reply: a step's events, a failed step, the pipe's end."""
        kind, value, load = msg
        if msg is CLOSED:
            self.process.join(1.0)  # it is on its way out: let its exit code show
            self._die(self._exit_words())
        self.load = load or self.load
        self._stepped = time.monotonic()
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

    def _take_ready(self, msg: tuple) -> None:
        kind, value, _ = msg
        if kind == "refused":
            raise ValueError(value)
        if kind != "reply":  # CLOSED: it exited while loading
            self.process.join(1.0)
            raise ReplicaDied(self._exit_words())
        self._info = value["describe"]
        self.runner = ReplicaModel(value["vocab_size"])
        self.eos_token_ids = value["eos_token_ids"]

    def _watch_start(self) -> None:
        """A restarted process: its ready message, or its failure to start (then it stays
        dead: a start that failed once would fail again)."""
        msg = self.link.next(STEP_WAIT_S)
        try:
            if msg is None:
                if time.monotonic() - self._started > START_TIMEOUT_S:
                    raise ReplicaDied(f"{self.name} did not start within {START_TIMEOUT_S:.0f} s")
                return
            self._take_ready(msg)
        except (ValueError, ReplicaDied) as err:
            self.starting = False
            self.dead = f"{self.name} could not be restarted: {err}"
            log.error("%s", self.dead)
            self._kill()
            return
        self.starting, self.dead = False, None
        self.in_flight, self.load = set(), {"waiting": 0, "running": 0, "swapped": 0}
        log.warning("%s is serving again (restart %d)", self.name, self.restarts)
        if self.bus.wants("reset"):  # its request ids start again at 0
            info = {**self._info, "replica": self.index}
            self.bus.emit(events.EngineReset(time=self.clock(), info=info))
        if self.on_ready is not None:
            self.on_ready(self)

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

    def _kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()  # SIGKILL: a stopped process goes too
            self.process.join(5.0)

    def _die(self, why: str) -> None:
        """Mark it dead (its requests end with ``why`` at the loop's next turn), stop the
        process if it is still there, tell the fleet, and raise."""
        if self.dead is not None:
            raise ReplicaDied(self.dead)
        words = f"{why}; its requests end here, the other replicas go on"
        self.dead = self.died_of = self._death = words
        log.error("%s", words)
        self._kill()
        if self.on_death is not None:
            self.on_death(self)  # which may restart it: ``dead`` then says so
        raise ReplicaDied(words)
