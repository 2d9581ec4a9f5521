"""The server: around the engines' own thread (minicb/driver: engine_loop, and each
request's stream), the visualizer's app and WebSocket (app, hub, viewer_socket, controls,
workload), the OpenAI-compatible API (openai_api, with openai_request, openai_params,
openai_reply, waiting_gate and api_error), the door to all of them (guard), and what the
``demo``, ``serve`` and ``replay --serve`` commands start (launch)."""
