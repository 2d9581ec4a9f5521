"""A fleet's ``/metrics``: each replica's Prometheus figures, with a ``replica`` label.

Each replica numbers its own requests, so one PrometheusMetrics (which follows requests by
id) listens to each replica's bus; a scrape collects them all and merges each metric's
samples into one family, every sample labelled with its replica (``replica="replica0"``),
as Prometheus wants one family per name. The same figures as one engine's, per replica:
``sum by (model_name)`` over the label gives the fleet's.

Three more say whether each replica can be sent requests (read from the handles at the
scrape, so a stopped replica shows here within its silence bound, before anything has
been routed to it): ``minicb:replica_up`` (1 serving, 0 silent, dead or restarting),
``minicb:replica_silent_seconds`` (since its latest message; it beats every 0.5 s) and
``minicb:replica_restarts_total``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from minicb.telemetry.prometheus import PrometheusMetrics


class FleetMetrics:
    """One PrometheusMetrics per replica (``members``: engine name -> its metrics),
    exposed as one text."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, replicas: dict[str, Any]) -> None:
        """``replicas``: engine name -> engine (each with its ``bus``; a Replica's
        ``serving``, ``link`` and ``restarts`` give its state)."""
        self.model_name, self.replicas = model_name, dict(replicas)
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
        yield from self._states()

    def _states(self) -> Iterator[Metric]:
        labels = ["model_name", "replica"]
        up = GaugeMetricFamily(_name("minicb:replica_up"), UP_DOC, labels=labels)
        silent = GaugeMetricFamily(_name("minicb:replica_silent_seconds"), SILENT_DOC,
                                   labels=labels)  # fmt: skip
        restarts = CounterMetricFamily(_name("minicb:replica_restarts"), RESTARTS_DOC,
                                       labels=labels)  # fmt: skip
        for name, replica in self.replicas.items():
            if not hasattr(replica, "serving"):  # an engine in this process: no link
                continue
            at = [self.model_name, name]
            up.add_metric(at, float(replica.serving))
            silent.add_metric(at, round(replica.child.link.silent_s(), 3))
            restarts.add_metric(at, float(replica.restarts))
        yield from (up, silent, restarts)

    def exposition(self) -> bytes:
        """The text format for ``GET /metrics``; serve it with ``content_type``."""
        return generate_latest(self.registry)


UP_DOC = "1 while the replica may be sent requests; 0 while silent, dead or restarting"
SILENT_DOC = "Seconds since the replica's latest message (it sends a heartbeat every 0.5 s)"
RESTARTS_DOC = "Fresh processes started for the replica after it died"


def _name(name: str) -> str:
    """``name``, or with ``_`` for ``:`` where this prometheus_client refuses the colon (as
    PrometheusMetrics names its own)."""
    try:
        GaugeMetricFamily(name, "", labels=["model_name"])
    except ValueError:
        return name.replace(":", "_")
    return name
