"""HandlerListener: a bus listener made of ``_on_<kind>`` methods, one per kind it handles.

The bus calls ``listener(events)`` once with a step's events in order
(minicb.core.bus); each event's handler is looked up by kind in a dict built once,
not by name per event, and kinds without one are skipped. MetricsCollector and
PrometheusMetrics are such listeners. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # events imports the scheduler's plan, which imports metrics (and this)
    from minicb.core.events import Event


def handlers(listener: object) -> dict[str, Any]:
    """A listener's ``_on_<kind>`` methods by kind: looked up once, not by name per event."""
    return {n[4:]: getattr(listener, n) for n in dir(listener) if n.startswith("_on_")}


class HandlerListener:
    """Dispatches each event to ``self._on_<event.kind>``, if there is one."""

    def __init__(self) -> None:
        self._handlers = handlers(self)

    def __call__(self, events: Sequence[Event]) -> None:
        """A step's events (or any sequence of events), in order."""
        get = self._handlers.get
        for event in events:
            handler = get(event.kind)
            if handler is not None:
                handler(event)
