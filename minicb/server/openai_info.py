"""The routes that describe the server rather than generate: /v1/models, /health,
/metrics (Prometheus text), and an OpenAI-style 404 for any other /v1 path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from minicb.telemetry.prometheus import PrometheusMetrics
from minicb.server.engine_loop import EngineLoop
from minicb.server.openai_errors import APIError

METRICS_READ_TIMEOUT_S = 2.0


class InfoRoutes:
    def __init__(
        self,
        loop: EngineLoop,
        engine_name: str,
        model_name: str,
        prometheus: PrometheusMetrics,
        check_model: Callable[[str], None],
    ) -> None:
        self.loop, self.engine_name, self.model_name = loop, engine_name, model_name
        self.prometheus, self.check_model = prometheus, check_model

    @property
    def engine(self) -> Any:
        return self.loop.engines[self.engine_name]  # looked up each time: rebuilds replace it

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "minicb",
            "max_model_len": self.engine.max_model_len,
        }

    async def models(self) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, model: str) -> JSONResponse:
        self.check_model(model)
        return JSONResponse(self.model_card())

    async def health(self) -> JSONResponse:
        if not self.loop.alive:
            return JSONResponse({"status": "engine thread stopped"}, status_code=503)
        return JSONResponse({"status": "ok", "model": self.model_name})

    async def metrics(self) -> Response:
        # KV usage is otherwise set by steps only, so an idle engine would keep showing its
        # last busy figure after aborts; read the pool now, in the engine thread.
        def kv() -> tuple[int, int]:
            blocks = self.engine.scheduler.blocks
            return blocks.num_used_blocks, blocks.num_blocks

        try:
            used, total = await asyncio.wait_for(self.loop.acall(kv), METRICS_READ_TIMEOUT_S)
            self.prometheus.kv_usage.set(used / total if total else 0.0)
        except TimeoutError:
            pass  # a stuck engine thread must not stall the scrape; serve what is known
        return Response(self.prometheus.exposition(), media_type=self.prometheus.content_type)

    async def unknown(self, request: Request, path: str) -> JSONResponse:
        raise APIError(
            f"no route {request.method} /v1/{path}; see /v1/models, /v1/completions, "
            "/v1/chat/completions",
            status=404,
            code="unknown_url",
        )
