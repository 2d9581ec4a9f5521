"""The disaggregated fleet seen as one engine: what the server's routes and its EngineLoop
ask of an engine (as ``Fleet`` answers them for replicas), answered from the prefill and
decode engines.

The model's name is the one it was given (``model_name``, as ``Fleet``'s); its tokenizer
and its chat template are every engine's (the first prefill engine's here, in this
process); the longest request is the shorter of the two sides'; queue sizes add up every
engine's. ``engine_loop`` is the server's one loop over every
engine, with requests sent to ``FLEET`` routed through the fleet (a request's stream moves
from its prefill engine to its decode engine).
"""

from __future__ import annotations

from typing import Any

from minicb.fleet.fleet import FLEET  # the name the server's requests are sent to
from minicb.fleet.replica import Replica


class EngineShaped:
    """DisaggregatedFleet's engine-shaped face, for the server (a mixin on its engines)."""

    prefill: list[Replica]
    decode: list[Replica]
    engines: dict[str, Replica]
    model_name: str  # the served name (loader.model_name), set by DisaggregatedFleet
    _loop: Any
    _handle: Any  # Handoffs': act on the events queued so far

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
        of its rounds it acts on the engines' events of the last one (``_handle``): hand-offs,
        sends and frees happen there, once every listener has had the events."""
        from minicb.driver.engine_loop import EngineLoop

        if self._loop is None:
            self._loop = EngineLoop(
                dict(self.engines), feeder=lambda _engines: self._handle(), fleets={FLEET: self}
            )
        return self._loop
