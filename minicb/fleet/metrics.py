"""A fleet's ``/metrics``: each replica's Prometheus figures, with a ``replica`` label.

Each replica numbers its own requests, so one PrometheusMetrics (which follows requests by
id) listens to each replica's bus; a scrape collects them all and merges each metric's
samples into one family, every sample labelled with its replica (``replica="replica0"``),
as Prometheus wants one family per name. The same figures as one engine's, per replica:
``sum by (model_name)`` over the label gives the fleet's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from minicb.telemetry.prometheus import PrometheusMetrics


class FleetMetrics:
    """One PrometheusMetrics per replica (``members``: engine name -> its metrics),
    exposed as one text."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, replicas: dict[str, Any]) -> None:
        """``replicas``: engine name -> engine (each with its ``bus``)."""
        self.members = {name: PrometheusMetrics(model_name) for name in replicas}
        for name, engine in replicas.items():
            engine.bus.subscribe(self.members[name])
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for replica, metrics in self.members.items():
            for family in metrics.collect():
                into = merged.get(family.name)
                if into is None:
                    into = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = into
                into.samples += [
                    s._replace(labels={**s.labels, "replica": replica}) for s in family.samples
                ]
        yield from merged.values()

    def exposition(self) -> bytes:
        """The text format for ``GET /metrics``; serve it with ``content_type``."""
        return generate_latest(self.registry)
