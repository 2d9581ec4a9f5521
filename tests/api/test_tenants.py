"""Tenants at the API's door (serve --tenant, minicb/server/tenant_gate.py): keys name
tenants, requests wait in the fair queue while the engine has no room, a full tenant queue
and a tenant over its token rate are 429s naming the limit (the rate's with Retry-After),
a client that leaves while queued leaves the queue, and /metrics counts it all per tenant."""

from __future__ import annotations

import argparse
import concurrent.futures
import time

import httpx
import pytest

from minicb.server.serve_command import build_serve
from tests.api.live import live_server
from tests.helpers import wait_for

CONTROLLER, LIGHT, HEAVY, CAPPED = "ctl-key", "light-key", "heavy-key", "capped-key"


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    from minicb.cli import build_parser

    argv = ["serve", "--model", tiny_llama_dir, "--dtype", "float32", "--num-kv-blocks", "64"]
    argv += ["--no-measure-utilisation", "--api-key", CONTROLLER, "--max-in-flight", "1"]
    argv += ["--tenant", f"light:{LIGHT}:0", "--tenant", f"heavy:{HEAVY}:0"]
    argv += ["--tenant", f"capped:{CAPPED}:1:1", "--tenant-max-queued", "3"]
    argv += ["--tenant-quantum", "64"]
    args: argparse.Namespace = build_parser().parse_args(argv)
    app, loop, engine, name = build_serve(args)
    loop.start()
    with live_server(app) as url:
        yield url, loop, app.state.openai.tenants, name
    loop.stop()


def post(url: str, model: str, key: str, prompt: list[int], max_tokens: int = 4, timeout=60):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=timeout)


def test_the_rate_limit_answers_429_with_retry_after_naming_the_rate(served):
    url, _, gate, model = served
    # 1 token/s, a burst of 10: 4 prompt + 4 max_tokens fits once, not twice
    assert post(url, model, CAPPED, [5] * 4, max_tokens=4).status_code == 200
    again = post(url, model, CAPPED, [5] * 4, max_tokens=4)
    assert again.status_code == 429
    err = again.json()["error"]
    assert err["code"] == "tenant_rate_limited" and "1 tokens/s" in err["message"]
    assert int(again.headers["Retry-After"]) >= 5  # 6 tokens short at 1 a second
    too_big = post(url, model, CAPPED, [5] * 4, max_tokens=8)  # 12: past the burst
    assert too_big.status_code == 400
    assert too_big.json()["error"]["code"] == "tenant_request_too_large"
    assert post(url, model, LIGHT, [5] * 4, max_tokens=4).status_code == 200  # others go on
    assert gate.snapshot()["tenants"]["capped"]["rejected"] == {"rate_limited": 1, "too_large": 1}


def ids(answer: httpx.Response) -> int:
    return int(answer.headers["X-Minicb-Request-Id"])


def test_requests_wait_by_tenant_and_a_flood_does_not_go_first(served):
    """One request in flight at a time (--max-in-flight 1), quantum 64 tokens (a request's
    least cost: one request a turn): one heavy
    request runs, three wait (its bound), a fourth is refused; a light request that comes
    after them all is the second to run after the one in flight."""
    url, loop, gate, model = served
    loop.pause()
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            heavy = [pool.submit(post, url, model, HEAVY, [7, i + 8]) for i in range(4)]
            wait_for(lambda: gate.snapshot()["tenants"]["heavy"]["queued"] == 3, 30)
            light = pool.submit(post, url, model, LIGHT, [9, 10])
            wait_for(lambda: gate.snapshot()["tenants"]["light"]["queued"] == 1, 30)
            full = post(url, model, HEAVY, [7, 1])
            loop.resume()
            heavy_ids = sorted(ids(f.result()) for f in heavy)
            light_id = ids(light.result())
    finally:
        loop.resume()
    assert full.status_code == 429 and full.json()["error"]["code"] == "tenant_queue_full"
    assert "3 requests queued" in full.json()["error"]["message"]
    assert heavy_ids[1] < light_id < heavy_ids[2]
    wait_for(lambda: gate.in_flight == 0, 30)
    assert all(v["queued"] == 0 for v in gate.snapshot()["tenants"].values())


def test_a_client_that_leaves_while_queued_leaves_the_queue(served):
    url, loop, gate, model = served
    loop.pause()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(post, url, model, LIGHT, [11, 12])
            wait_for(lambda: gate.in_flight == 1, 30)
            with pytest.raises(httpx.ReadTimeout):
                post(url, model, LIGHT, [13, 14], timeout=1.0)
            wait_for(lambda: gate.snapshot()["tenants"]["light"]["queued"] == 0, 30)
            loop.resume()
            assert first.result().status_code == 200
    finally:
        loop.resume()
    wait_for(lambda: gate.in_flight == 0, 30)
    time.sleep(0.2)
    assert gate.in_flight == 0


def test_metrics_count_each_tenant(served):
    url, _, _, model = served
    assert post(url, model, CONTROLLER, [3, 4]).status_code == 200  # the default tenant
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {CONTROLLER}"}).text
    assert 'minicb:tenant_dispatched_total{tenant="default"}' in text
    assert 'minicb:tenant_queued_requests{tenant="light"} 0' in text
    assert 'minicb:tenant_rejected_total{tenant="heavy",reason="queue_full"}' in text
    assert "minicb:fair_queue_capacity 1" in text
    assert "light-key" not in text and "heavy-key" not in text  # keys never shown


def test_tenant_options_are_checked(tiny_llama_dir):
    from minicb.cli import build_parser

    base = ["serve", "--model", tiny_llama_dir, "--api-key", "k"]
    for extra, words in (
        (["--tenant", "a:x"], "NAME:KEY:PRIORITY"),
        (["--tenant", "a:x:0", "--tenant", "a:y:0"], "must differ"),
        (["--tenant", "default:x:0"], "must differ"),
        (["--tenant", "a:k:0"], "differ from the other keys"),
    ):
        args = build_parser().parse_args(base + extra)
        with pytest.raises(ValueError, match=words):
            build_serve(args)
