"""The server: the engines in their own thread (engine_loop), the visualizer's app and
WebSocket (app, controls, workload), the OpenAI-compatible API (openai_api,
openai_request), and what the ``demo``, ``serve`` and ``replay --serve`` commands start
(launch)."""
