"""A replica's process and its life: started, heard from, declared dead, restarted.

The handle the fleet holds (replica.py) is shaped like an engine; this is what stands
behind it. The process is a whole engine (its own copy of the model, its own KV pool)
started with torch.multiprocessing spawn, as the tensor-parallel workers are, running
replica_worker.py; its pipe is ``link`` (replica_link.py), whose messages the engine
thread takes in order (replica_inbox.py). Each one it takes says the process is alive
(``heard_from``).

When is a replica gone? Once ready it says "alive" every HEARTBEAT_S (0.5 s), from a
thread of its own, whatever its engine is doing. So:

- silent for ``silent_after_s`` (SILENT_AFTER_S, 3 s: six heartbeats missed): stopped
  (SIGSTOP, a debugger), frozen or gone. From that moment it is not ``serving`` (the
  router passes it by, /health and /metrics name it), and the next turn or round trip
  declares it dead;
- beating, but no step finished for ``stall_timeout_s`` while it holds requests, or no
  reply in that time: hung inside a step (a GPU that never returns);
- its process exited (the pipe ended).

A dead replica's process is killed; the next turn raises ``ReplicaDied`` once
(``unsaid_death``: the engine loop then ends each of its requests with that error, naming
it, as after a failed step) and ``died`` tells the handle, whose fleet takes it out of the
router's rotation and may ``restart()`` it: a fresh process under the same name, which
serves again once its model is loaded (``watch_start``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from minicb.fleet.replica_link import ReplicaLink

log = logging.getLogger(__name__)

STEP_WAIT_S = 0.01  # the engine loop's longest wait for one replica's message per round
SILENT_AFTER_S = 3.0  # no message at all (heartbeats every 0.5 s) for this long: stalled
STALL_TIMEOUT_S = 120.0  # beating, but no step nor reply for this long while needed: hung
START_TIMEOUT_S = 600.0  # loading the model in a fresh process (a first run converts it)


class ReplicaDied(RuntimeError):
    """A replica's process died or stopped answering; the message names it."""


def idle_load() -> dict[str, int]:
    """The queue sizes of a replica that holds nothing (a fresh process)."""
    return {"waiting": 0, "running": 0, "swapped": 0}


class ReplicaProcess:
    """One replica's process, its pipe, and whether it lives (see the module doc)."""

    def __init__(
        self,
        index: int,
        name: str,
        spawn: tuple,
        *,
        stall_timeout_s: float,
        silent_after_s: float,
        holding: Callable[[], bool],
        died: Callable[[], None],
    ) -> None:
        """Start the process; ``spawn`` is replica_worker.main's (model, config, threads,
        role). ``holding`` says whether requests are in flight there (a step that never ends
        matters then); ``died`` is told of a death."""
        self.index, self.name, self._spawn = index, name, spawn
        self.stall_timeout_s, self.silent_after_s = stall_timeout_s, silent_after_s
        self._holding, self._died = holding, died
        self.dead: str | None = None  # why it is out of service, while it is
        self.died_of: str | None = None  # its latest death, in words
        self.unsaid_death: str | None = None  # a death not raised from a turn yet
        self.starting = False  # a restarted process is loading its model
        self.restarts = 0
        self.start()

    def start(self) -> None:
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

    def heard_from(self) -> None:
        """A step's events or a reply came: the process is not hung."""
        self._stepped = time.monotonic()

    def ready(self, timeout_s: float) -> dict[str, Any]:
        """Wait until the engine is built: its ready message (raises its error if it could
        not be built)."""
        deadline = time.monotonic() + timeout_s
        while (msg := self.link.next(min(1.0, max(deadline - time.monotonic(), 0)))) is None:
            if time.monotonic() > deadline:
                self._die(f"{self.name} did not start within {timeout_s:.0f} s")
        return self._ready_message(msg)

    def restart(self) -> None:
        """A fresh process under this name, after a death; ``watch_start`` takes its ready."""
        self.kill()
        self.link.close()
        self.restarts += 1
        self.starting = True
        self.dead = f"restarting (restart {self.restarts}) after: {self.died_of}"
        log.warning("%s: starting a fresh process (restart %d)", self.name, self.restarts)
        self.start()

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

    @property
    def needs_turn(self) -> bool:
        """Something a turn must do: say a death, watch a restart, or declare a silence."""
        return (
            self.unsaid_death is not None
            or self.starting
            or (self.dead is None and self.link.silent_s() > self.silent_after_s)
        )

    def ask_to_stop(self) -> None:
        """Tell the process to leave (``stop`` then waits for it)."""
        if not self.link.closed:
            self.link.send(("stop",))

    def stop(self, timeout_s: float) -> None:
        """Ask the process to leave, and make sure it has (at once if it is silent: a
        stopped process would not hear)."""
        self.ask_to_stop()
        silent = self.link.silent_s() > self.silent_after_s
        self.process.join(0 if silent else timeout_s)
        self.kill()
        self.dead = self.dead or f"{self.name} was shut down"
        self.starting = False
        self.link.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()  # SIGKILL: a stopped process goes too
            self.process.join(5.0)

    def _ready_message(self, msg: tuple) -> dict[str, Any]:
        kind, value, _ = msg
        if kind == "refused":
            raise ValueError(value)
        if kind != "reply":  # CLOSED: it exited while loading
            self.process.join(1.0)
            raise ReplicaDied(self._exit_words())
        return value

    def watch_start(self) -> dict[str, Any] | None:
        """A restarted process: its ready message, or its failure to start (then it stays
        dead: a start that failed once would fail again)."""
        msg = self.link.next(STEP_WAIT_S)
        try:
            if msg is None:
                if time.monotonic() - self._started > START_TIMEOUT_S:
                    raise ReplicaDied(f"{self.name} did not start within {START_TIMEOUT_S:.0f} s")
                return None
            ready = self._ready_message(msg)
        except (ValueError, ReplicaDied) as err:
            self.starting = False
            self.dead = f"{self.name} could not be restarted: {err}"
            log.error("%s", self.dead)
            self.kill()
            return None
        self.starting, self.dead = False, None
        log.warning("%s is serving again (restart %d)", self.name, self.restarts)
        return ready

    # ---- its death -----------------------------------------------------------------------
    def check(self, call_sent: float | None = None) -> None:
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
        if self._holding() and now - self._stepped > self.stall_timeout_s:
            self._die(
                f"{self.name} finished no step for {self.stall_timeout_s:.0f} s while "
                "holding requests"
            )

    def ended(self) -> NoReturn:
        """Its pipe has ended: the process has exited or is on its way out."""
        self.process.join(1.0)  # let its exit code show
        self._die(self._exit_words())

    def _exit_words(self) -> str:
        code = self.process.exitcode
        if code is None:
            how = "closed its pipe"
        elif code >= 0:
            how = f"exited with code {code}"
        else:
            how = f"was killed by signal {-code}"
        return f"{self.name} (pid {self.process.pid}) {how}"

    def _die(self, why: str) -> NoReturn:
        """Mark it dead (its requests end with ``why`` at the loop's next turn), stop the
        process if it is still there, tell the handle, and raise."""
        if self.dead is not None:
            raise ReplicaDied(self.dead)
        words = f"{why}; its requests end here, the other replicas go on"
        self.dead = self.died_of = self.unsaid_death = words
        log.error("%s", words)
        self.kill()
        self._died()  # whose fleet may restart it: ``dead`` then says so
        raise ReplicaDied(words)
