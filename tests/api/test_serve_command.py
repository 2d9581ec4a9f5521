"""``minicb serve`` wiring: its options parse, and the app it builds hosts the visualizer
at / beside the API on one engine named "api" (create_app in serve mode)."""

from __future__ import annotations

import httpx
import pytest

from minicb.cli import build_parser
from minicb.server.serve_command import build_serve
from tests.api.live import live_server


def test_serve_options_parse_with_the_engine_options():
    args = build_parser().parse_args(
        [
            "serve",
            "--port",
            "9001",
            "--api-key",
            "k",
            "--max-waiting",
            "8",
            "--policy",
            "priority",
            "--preemption-mode",
            "swap",
            "--dtype",
            "float32",
            "--device",
            "cpu",
        ]
    )
    assert (args.host, args.port, args.api_key, args.max_waiting) == ("127.0.0.1", 9001, "k", 8)
    assert (args.policy, args.preemption_mode, args.dtype) == ("priority", "swap", "float32")


def test_bad_limits_are_refused_with_a_clear_error(tiny_llama_dir):
    args = build_parser().parse_args(["serve", "--model", tiny_llama_dir, "--max-waiting", "0"])
    with pytest.raises(ValueError, match="--max-waiting must be at least 1"):
        build_serve(args)


def test_the_built_app_serves_the_visualizer_and_the_api(tiny_llama_dir):
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            tiny_llama_dir,
            "--num-kv-blocks",
            "64",
            "--served-model-name",
            "tiny",
            "--api-key",
            "k",
        ]
    )
    app, loop, engine, name = build_serve(args)
    assert name == "tiny" and list(loop.engines) == ["api"]
    loop.start()
    try:
        with live_server(app) as url:
            page = httpx.get(url + "/")
            assert page.status_code == 200 and "html" in page.text.lower()
            auth = {"Authorization": "Bearer k"}
            assert httpx.get(url + "/v1/models", headers=auth).json()["data"][0]["id"] == "tiny"
            body = {"model": "tiny", "prompt": [3, 4], "max_tokens": 2, "ignore_eos": True}
            done = httpx.post(url + "/v1/completions", json=body, headers=auth).json()
            assert done["usage"]["total_tokens"] == 4
            metrics = httpx.get(url + "/metrics", headers=auth).text
            assert "minicb:iterations_total" in metrics
    finally:
        loop.stop()
