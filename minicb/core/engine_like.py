"""EngineLike: what the driver, the API routes and the page call on whatever they drive.

Four things are driven: ``LLMEngine`` (engine.py), a replica's handle (an engine in another
process, minicb/fleet/replica.py), a fleet of replicas behind a router (fleet/fleet.py) and
a disaggregated pair of prefill and decode engines (fleet/disagg_fleet.py). The core names
none of the last three: they fit these protocols by their shape, and
tests/test_engine_like.py checks that each has every member with a signature that fits.

They differ on purpose in one place, so the honest shape is one shared part and two kinds:

- ``EngineLike``, the shared part: what the OpenAI routes read of the name they serve,
  whichever it is (its tokenizer, its context, its pool, its queues, its events).
- ``SteppedEngine``: an engine the driver steps, one iteration a round (``LLMEngine``, a
  ``Replica``). A request added to it stays there: ``add_request`` returns its id.
- ``RoutingFleet``: a fleet, which the driver never steps (its engines are the loop's
  engines, stepped like any other) and which routes a request it is given: its
  ``add_request`` returns the engine chosen and the request's id there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from minicb.core import events
    from minicb.core.bus import EventBus
    from minicb.core.config import EngineConfig, SamplingParams
    from minicb.core.engine_views import KVSnapshot


class Listenable(Protocol):
    """A bus one can listen to: an engine's ``EventBus``, or a fleet's over its engines'."""

    def subscribe(
        self, listener: Callable[[Sequence[events.Event]], Any], kinds: Iterable[str] | None = None
    ) -> Callable[[Sequence[events.Event]], Any]:
        """The API's waiting-queue gate and Prometheus metrics listen here."""
        ...


class EngineLike(Protocol):
    """What an engine and a fleet both offer: the part the OpenAI routes read."""

    @property
    def bus(self) -> Listenable:
        """Where the API's gate and metrics hear arrivals, aborts and ends."""
        ...

    @property
    def max_model_len(self) -> int:
        """The longest prompt plus output: the API's length rule and default max_tokens."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (None for a runner without one): the API's length rule reads its
        vocabulary before tokenizing."""
        ...

    def clock(self) -> float:
        """Now, on the clock its requests are stamped with: the driver's arrival time."""
        ...

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """A prompt's token ids: the API tokenizes in its own thread, the driver if not."""
        ...

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """A chat's prompt token ids: the chat completions route."""
        ...

    def kv_snapshot(self) -> KVSnapshot:
        """The KV pool now: the chat route's default max_tokens, /metrics' pool use."""
        ...

    def queue_sizes(self) -> dict[str, int]:
        """Waiting, running and swapped requests: the API's waiting-queue gate."""
        ...


class SteppedEngine(EngineLike, Protocol):
    """An engine the driver (minicb/driver/engine_loop.py) steps and the page draws."""

    @property
    def bus(self) -> EventBus:
        """Its events: the driver's streams and the page's frames listen here."""
        ...

    @property
    def config(self) -> EngineConfig:
        """Its settings: the page reads how many rows it may draw in full."""
        ...

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        *,
        prompt_token_ids: list[int] | None = None,
    ) -> int:
        """Queue a request here and return its id (ValueError if it can never be served):
        the driver's submit, the demo's feeder, a prompt typed on the page."""
        ...

    def step(self) -> object:
        """One iteration (or a replica's turn); the driver ignores what it returns."""
        ...

    def has_unfinished(self) -> bool:
        """Whether a step has work: the driver steps only the engines that have."""
        ...

    def abort_request(self, request_id: int) -> bool:
        """Stop one request and free its blocks: a client that hung up."""
        ...

    def abort_all(self) -> list[int]:
        """Stop every request: the driver, after a step that failed."""
        ...

    def describe(self) -> dict[str, Any]:
        """Its settings in words: the page's and /health's description of it."""
        ...

    def kv_snapshot_event(self) -> events.KVSnapshotEvent:
        """The pool's map as of its last published event: a browser's first frame."""
        ...

    def live_requests(self) -> list[dict[str, Any]]:
        """Each request it holds, in words: a browser's first frame."""
        ...


class RoutingFleet(EngineLike, Protocol):
    """A fleet the driver routes requests through (``EngineLoop(fleets=...)``)."""

    @property
    def replicas(self) -> Mapping[str, SteppedEngine]:
        """Its engines by name, each among the driver's engines: /health and /metrics
        name them, the driver's ``failing`` reads them."""
        ...

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> tuple[str, int]:
        """Route a request and queue it there: the engine's name and the request's id in it
        (the driver opens its stream there)."""
        ...

    def health(self) -> dict[str, str]:
        """Each engine's state in words: /health's body."""
        ...

    def unavailable(self) -> str | None:
        """Why no request could be served now, or None: /health's 503."""
        ...
