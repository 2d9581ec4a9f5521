"""The server: around the engines' own thread (minicb/driver: engine_loop, and each
request's stream), the visualizer's app and WebSocket (app, hub, viewer_socket, broadcast,
frames with request_history, replay_view, redaction; controls with control_fields and
engine_rebuild; workload, lesson), the OpenAI-compatible API (openai_api, with
openai_request, openai_params, openai_reply, tokenizer_queue, waiting_gate and api_error;
/health and /metrics in status_routes), the door to all of them (guard), and what the
``demo``, ``serve`` and ``replay --serve`` commands start (launch, demo_command,
serve_command)."""

import minicb.features  # noqa: F401  (a product may run engines with any feature)
