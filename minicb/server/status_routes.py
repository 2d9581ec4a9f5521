"""/health and /metrics: how an operator (a load balancer, a Prometheus scraper, a
teacher) sees whether the server can serve and what it has done.

/health answers 200 while a request can be served and 503, with the reason, whenever one
could not be. /metrics is the engine's Prometheus figures (telemetry/prometheus.py; a
fleet's: each replica's, labelled, fleet/metrics.py), with the pool's use read afresh in
the engine thread, each step failure counted, and the browsers watching /ws and the bytes
sent to them. Both are routes of the same app as the OpenAI API (openai_api.py installs
them), for one engine or fleet of the EngineLoop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from minicb.driver.command_queue import EngineStopped
from minicb.driver.engine_loop import EngineLoop
from minicb.fleet.fleet_prometheus import FleetMetrics
from minicb.fleet.replica import ReplicaDied
from minicb.server.redaction import text_free
from minicb.server.tenant_gate import TenantGate, prometheus_lines
from minicb.telemetry.prometheus import PrometheusMetrics

METRICS_READ_TIMEOUT_S = 2.0


@dataclass(eq=False)
class StatusRoutes:
    """/health and /metrics for one engine (or fleet) of an EngineLoop."""

    loop: EngineLoop
    engine_name: str
    model_name: str
    prometheus: PrometheusMetrics | FleetMetrics
    tenants: TenantGate | None = None  # the fair queue, if the server has one

    async def health(self) -> JSONResponse:
        """200 while a request can be served; 503 with the reason whenever one could not
        be: the engine thread has ended; a fleet has no replica serving, or
        (disaggregated) no live prefill or no live decode engine (``fleet.unavailable()``);
        the latest step failed (say, a tensor-parallel group broken for good; for a
        fleet, every replica's). A fleet's body names each replica's state, so a stalled
        or restarting one is named while the others serve ("degraded"). The error itself
        is on /metrics, behind the key."""
        fleet = self.loop.fleets.get(self.engine_name)
        states = fleet.health() if fleet is not None else None
        named = {} if states is None else {"replicas": states}
        if not self.loop.alive:
            return JSONResponse({"status": "engine thread stopped"}, status_code=503)
        why = fleet.unavailable() if fleet is not None else None
        if why is not None:
            return JSONResponse({"status": why, **named}, status_code=503)
        if self.loop.failing(self.engine_name):
            names = [self.engine_name] if fleet is None else list(fleet.replicas)
            failed = sum(self.loop.failed_steps.get(name, 0) for name in names)
            body = {"status": "the latest step failed", "failed_steps": failed, **named}
            return JSONResponse(body, status_code=503)
        status = "ok" if all(s == "ok" for s in (states or {}).values()) else "degraded"
        return JSONResponse({"status": status, "model": self.model_name, **named})

    async def metrics(self, request: Request) -> Response:
        # One engine's metrics, or each replica's of a fleet (FleetMetrics.members).
        members = getattr(self.prometheus, "members", {self.engine_name: self.prometheus})
        for name, prometheus in members.items():
            # KV usage is otherwise set by steps only, so an idle engine would keep showing
            # its last busy figure after aborts; read the pool now, in the engine thread.
            read = self.loop.acall(lambda name=name: self.loop.engines[name].kv_snapshot())
            try:
                kv = await asyncio.wait_for(read, METRICS_READ_TIMEOUT_S)
                prometheus.kv_usage.set(kv.num_used / kv.num_blocks if kv.num_blocks else 0.0)
            except (TimeoutError, EngineStopped, ReplicaDied):
                pass  # a stuck or ended engine thread, a dead replica: never stall the scrape
            error = self.loop.last_error.get(name)  # viewers may scrape: shown text-free
            prometheus.note_failures(
                self.loop.failed_steps.get(name, 0), error and text_free(error)
            )
        body = self.prometheus.exposition() + _viewer_lines(request)
        if self.tenants is not None:
            body += prometheus_lines(self.tenants)
        return Response(body, media_type=self.prometheus.content_type)


def _viewer_lines(request: Request) -> bytes:
    """The browsers watching /ws and the bytes sent to them (Hub.viewer_figures), in the
    Prometheus text format: how a teacher sees what a class costs the server."""
    hub = getattr(request.app.state, "hub", None)
    if hub is None:
        return b""
    lines = []
    for name, value in hub.viewer_figures().items():
        kind = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# TYPE {name} {kind}", f"{name} {value}"]
    return ("\n".join(lines) + "\n").encode()
