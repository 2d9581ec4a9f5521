"""What ``minicb replay --serve`` shows a page: each recorded engine described as a live one
is (``replay_info``, for the hello), and its events folded as a live page gets them
(``replay_events``), sent after the hello in ``replay`` messages (``ReplayViews``).

A trace is large (a 47 MB trace folds into 37 MB of JSON) and the same for every page, so
its messages are built once per text class (``Client.sees_text``: what hub.Hub.shown lets a
page read), when the first page of that class opens, in a thread: the event loop only
awaits it, and keeps answering ``/``, the API and the other sockets meanwhile (folded,
redacted, encoded and compressed in the loop for each page, three pages of that trace held
``/`` for 6.3 s). A later page of the class gets the same bytes.

The messages are pieces of at most ``REPLAY_PIECE_BYTES`` of JSON each, compressed like a
frame (broadcast.compress): ``{"type": "replay", "piece": k, "last": bool, "traces":
{panel: {"header", "events"}}}``, a trace's events in order over consecutive pieces. The
page applies each piece's events as it comes, so no message is the whole trace at once.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from minicb.core.events import StepEvent
from minicb.server.broadcast import compress
from minicb.server.frames import StepFolder
from minicb.telemetry.kv_state import KVState

if TYPE_CHECKING:
    from minicb.server.hub import Client
    from minicb.telemetry.trace_reader import Trace

# JSON in one replay message at most (before compression): a few dozen messages for a
# trace of tens of megabytes, each one a page inflates and parses in a moment.
REPLAY_PIECE_BYTES = 1 << 20


def replay_info(name: str, trace: Trace) -> dict[str, Any]:
    """A recorded engine described as a live one is (see LLMEngine.describe)."""
    config = trace.header.get("config") or {}
    kv_total = next((e.plan.kv_total for e in trace.events if isinstance(e, StepEvent)), 0)
    return {
        "name": name,
        "batching": config.get("batching", name),
        "config": config,
        "model": trace.header.get("model"),
        "kv_total": kv_total,
        "block_size": config.get("block_size", 16),
        "has_tokenizer": True,
        "max_model_len": config.get("max_model_len"),
        # the recorded runner (a simulated GPU says so) and whether it was one
        "runner": trace.header.get("hardware") or {},
        "simulated": bool((trace.header.get("hardware") or {}).get("simulated")),
        "step": 0,
    }


def replay_events(name: str, trace: Trace) -> list[dict[str, Any]]:
    """A recorded engine's events folded as a live page gets them (frames.StepFolder), with
    every step's KV changes: a replay draws exactly the map the live page drew."""
    folder = StepFolder(replay_info(name, trace), KVState())
    folder.exact = True  # the whole trace is sent once: the slider needs every block
    return folder.fold(trace.events, tokens=True)


Shown = Callable[["Client", str, dict[str, Any]], dict[str, Any]]


class ReplayViews:
    """The replay messages of ``traces`` (panel name -> Trace), once per text class.

    ``shown(client, panel, event)`` is an event as that client may see it (Hub.shown).
    ``builds`` counts the classes built (each fold, redaction, encoding and compression
    of every trace)."""

    def __init__(self, traces: dict[str, Trace], shown: Shown) -> None:
        self.traces, self.shown = traces, shown
        self.builds = 0
        self._built: dict[Any, asyncio.Future[list[bytes]]] = {}  # text class -> its pieces
        # One build at a time: two would both contend for the GIL with the event loop, and
        # under the GIL together they finish no sooner than one after the other.
        self._one_at_a_time = threading.Lock()

    async def pieces(self, client: Client) -> list[bytes]:
        """The compressed messages for ``client``, in order: built in a thread for the first
        page of its text class; the pages that open meanwhile await the same build."""
        key = client.sees_text
        if key not in self._built:
            self._built[key] = asyncio.ensure_future(asyncio.to_thread(self._build, client))
        # shield: a page that leaves while it waits does not cancel its class's build
        return await asyncio.shield(self._built[key])

    def _build(self, client: Client) -> list[bytes]:
        with self._one_at_a_time:
            return self._build_alone(client)

    def _build_alone(self, client: Client) -> list[bytes]:
        self.builds += 1
        bodies = (
            body
            for name, trace in self.traces.items()
            for body in _bodies(name, trace.header, self._encoded(client, name, trace))
        )
        out: list[bytes] = []
        body = next(bodies)  # every trace gives at least one body (its header)
        for following in bodies:  # each body is finished once the next one is known
            out.append(compress(_message(len(out), False, body)))
            body = following
        out.append(compress(_message(len(out), True, body)))
        return out

    def _encoded(self, client: Client, name: str, trace: Trace) -> Iterator[str]:
        for event in replay_events(name, trace):
            yield json.dumps(self.shown(client, name, event))


def _bodies(name: str, header: dict[str, Any], events: Iterable[str]) -> Iterator[str]:
    """One trace's ``"panel": {"header": ..., "events": [...]}`` members, each with as many
    encoded events as fit REPLAY_PIECE_BYTES (one at least), in order."""
    head = f'{json.dumps(name)}: {{"header": {json.dumps(header)}, "events": ['
    part: list[str] = []
    size = len(head)
    for event in events:
        if part and size + len(event) + 2 > REPLAY_PIECE_BYTES:
            yield head + ", ".join(part) + "]}"
            part, size = [], len(head)
        part.append(event)
        size += len(event) + 2
    yield head + ", ".join(part) + "]}"


def _message(piece: int, last: bool, body: str) -> str:
    head = f'{{"type": "replay", "piece": {piece}, "last": {json.dumps(last)}'
    return f'{head}, "traces": {{{body}}}}}'
