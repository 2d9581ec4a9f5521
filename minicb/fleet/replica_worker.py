"""A replica's own process: one whole engine (its copy of the model, its KV pool), driven
by the fleet through one pipe.

The fleet starts this with torch.multiprocessing (spawn, as the tensor-parallel workers
are started: forking a process that has loaded torch is unsafe) and hands it one end of a
``Pipe``. The pipe is a socket pair that exists only between the two processes (no port,
no path): nobody else can write to it, so its pickles are the parent's own, as the
tensor-parallel workers' signed commands are rank 0's.

The loop: run the commands waiting on the pipe, step the engine if it has work, send what
the step published on its bus. Messages, parent to replica:

- ``("add", prompt, params, priority, arrival_time, prompt_token_ids,
  expected_output_tokens)``: the reply is the request's id, or the engine's refusal
  (ValueError's words);
- ``("abort", request_id)``, ``("abort_all",)``: the reply is ``abort_request``'s answer;
- ``("view", name)``: the reply is one of the engine's views (VIEWS), e.g. ``describe``;
- ``("stop",)``: leave;
- ``("kv_snapshot",)``: no reply; a ``("kv_events", snapshot, None)`` message instead, all
  the KV blocks it holds (kv_events.py), after the records it includes;
- a role's own commands (``role.commands``), where the replica has a role (below).

A replica may be given a ``role`` (a picklable object, e.g. the prefill and decode sides of
disaggregated serving, minicb/fleet/kv_link.py's and kv_receive.py's): it builds the engine
(``build``), answers its own commands (``command``), looks at what happened outside the
steps before each turn (``poll``: a transfer that completed) and says whether a step has
work (``has_work``) and how long an idle turn may wait for a command (``idle_wait_s``).

Replica to parent: ``("reply", value, load)`` or ``("refused", words, load)`` to the
command just run; ``("events", events, load)`` after each step (and after a command that
published some), every event the engine's bus carried, in order; ``("failed", words,
load)`` when a step raised (the engine undid it; the parent ends those requests with an
error, and the replica aborts them, as the engine loop does for an engine in its own
process); ``("kv_events", record, None)``, a plain replica's (no role) KV event record, as
soon as a step or a command changed its prefix cache (the router's index reads them).
``load`` is ``queue_sizes()`` just after: what the router reads. A reply always comes before the
events its command published, so the fleet can announce where it routed a request (its
``routed`` event) before the replica's own ``arrived``.

Once ready, a thread of its own also sends ``("alive", None, None)`` every HEARTBEAT_S,
whatever the engine is doing: a long step keeps beating, a stopped or frozen process
falls silent, and the fleet tells the two apart by that silence (replica.py,
SILENT_AFTER_S).
"""

from __future__ import annotations

import logging
import threading
from multiprocessing.connection import Connection
from typing import Any

from minicb.fleet.kv_events import KVEventPublisher

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # how long an idle replica waits for a command before looking again
HEARTBEAT_S = 0.5  # how often a ready replica says it is alive, busy or not
VIEWS = frozenset({"describe", "kv_snapshot", "kv_snapshot_event", "live_requests", "queue_sizes"})


def main(
    conn: Connection, index: int, model: str, config: Any, threads: int, role: Any = None
) -> None:
    """Entry point of a spawned replica: build the engine, say ready (with its
    description) or why not, then serve until ``stop`` or until the parent is gone."""
    import torch

    from minicb.core.engine import LLMEngine

    torch.set_num_threads(threads)
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        torch.cuda.set_device(index % torch.cuda.device_count())  # a GPU each, in turn
    try:
        engine = LLMEngine(model, config) if role is None else role.build(model, config)
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("refused", f"{type(err).__name__}: {err}", {}))
        return
    outbox: list[Any] = []
    engine.bus.subscribe(outbox.extend)  # every kind: the parent's subscribers choose
    ready = {
        "describe": engine.describe(),
        "vocab_size": engine.runner.vocab_size,
        "eos_token_ids": list(engine.eos_token_ids),
    }
    pipe = _Locked(conn)  # from here on two threads send: the loop and the heartbeat
    kv = None  # a role's engine (disaggregated serving) is not routed by prefix
    if role is None:
        kv = KVEventPublisher(engine, lambda record: pipe.send(("kv_events", record, None)))
    pipe.send(("reply", ready, engine.queue_sizes()))
    stop = threading.Event()
    threading.Thread(target=_beat, args=(pipe, stop), name="minicb-heartbeat", daemon=True).start()
    try:
        serve(pipe, engine, outbox, role, kv)
    except (EOFError, OSError):  # the parent is gone: nothing is left to serve
        log.warning("replica: the fleet closed its pipe; stopping")
    finally:
        stop.set()


class _Locked:
    """The pipe with its sends under a lock (a message is never interleaved with a
    heartbeat); ``poll`` and ``recv`` stay the loop's alone."""

    def __init__(self, conn: Connection) -> None:
        self._conn, self._lock = conn, threading.Lock()
        self.poll, self.recv = conn.poll, conn.recv

    def send(self, msg: tuple) -> None:
        with self._lock:
            self._conn.send(msg)


def _beat(conn: _Locked, stop: threading.Event) -> None:
    """Say "alive" every HEARTBEAT_S until stopped or the parent is gone."""
    while not stop.wait(HEARTBEAT_S):
        try:
            conn.send(("alive", None, None))
        except (OSError, ValueError):
            return


def serve(conn: Any, engine: Any, outbox: list[Any], role: Any = None, kv: Any = None) -> None:
    """Commands between steps; a step whenever the engine has work. ``kv``: the engine's
    KV event publisher, whose snapshot ``kv_snapshot`` asks for."""
    while True:
        if role is not None:
            role.poll(engine)
            _flush(conn, engine, outbox)
        busy = engine.has_unfinished() if role is None else role.has_work(engine)
        wait = 0.0 if busy else IDLE_WAIT_S if role is None else role.idle_wait_s()
        while conn.poll(wait):
            msg = conn.recv()
            if msg[0] == "stop":
                return
            if msg[0] == "kv_snapshot" and kv is not None:  # answered on the KV stream
                conn.send(("kv_events", kv.snapshot(), None))
                continue
            _answer(conn, engine, msg, outbox, role)
            _flush(conn, engine, outbox)
            wait = 0.0
        if engine.has_unfinished() if role is None else role.has_work(engine):
            try:
                engine.step()
            except Exception as err:  # noqa: BLE001 - the parent ends the requests
                log.exception("replica: a step failed")
                _flush(conn, engine, outbox)
                conn.send(("failed", f"{type(err).__name__}: {err}", engine.queue_sizes()))
                engine.abort_all()  # as the engine loop does after ending their streams
                _flush(conn, engine, outbox)
                continue
            _flush(conn, engine, outbox)


def _answer(conn: Any, engine: Any, msg: tuple, outbox: list[Any], role: Any = None) -> None:
    kind = msg[0]
    try:
        if kind == "add":
            _, prompt, params, priority, arrival, ids, expected = msg
            value = engine.add_request(
                prompt, params, priority, arrival, expected, prompt_token_ids=ids
            )
        elif kind == "abort":
            value = engine.abort_request(msg[1])
        elif kind == "abort_all":
            value = engine.abort_all()
        elif kind == "view" and msg[1] in VIEWS:
            value = getattr(engine, msg[1])()
        elif role is not None and kind in role.commands:
            value = role.command(engine, msg)
        else:
            raise ValueError(f"a replica has no command {msg[:2]!r}")
    except ValueError as err:  # the engine's refusal, in its own words
        conn.send(("refused", str(err), engine.queue_sizes()))
        return
    if kind != "add":
        # What a command changed (an abort, a sent KV released: their kv_changes) goes
        # before its reply, which the parent reads at once: after it, the events would
        # wait in the pipe while the replica idles. An add's "arrived" follows its reply,
        # after the router's event that names the new id.
        _flush(conn, engine, outbox)
    conn.send(("reply", value, engine.queue_sizes()))


def _flush(conn: Any, engine: Any, outbox: list[Any]) -> None:
    """Send what the bus carried since the last flush, in one message."""
    if outbox:
        events = list(outbox)
        outbox.clear()
        conn.send(("events", events, engine.queue_sizes()))
