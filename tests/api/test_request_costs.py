"""What one request may cost the others: a stop string longer than the limit is refused
with a 400 naming it, and a prompt is tokenized off the engine thread, so a slow one (a
megabyte of text) never stalls a running stream."""

from __future__ import annotations

import threading
import time

import httpx

from minicb import EngineConfig, FakeRunner, LLMEngine
from minicb.server.openai_params import MAX_STOP_CHARS
from tests.api.live import api_server

BODY = {"model": "fake", "prompt": [5, 6], "max_tokens": 4, "ignore_eos": True}


class SlowTokenizer:
    """Takes a second to encode (releasing the GIL, as the real tokenizers do)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        time.sleep(1.0)
        return [ord(c) % 200 for c in text[:8]]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


def engine_with(tokenizer=None, step_s: float = 0.0) -> LLMEngine:
    runner = FakeRunner(num_kv_blocks=64, tokenizer=tokenizer)
    if step_s:
        execute = runner.execute
        runner.execute = lambda plan: (time.sleep(step_s), execute(plan))[1]
    return LLMEngine(config=EngineConfig(num_kv_blocks=64), runner=runner)


def test_a_stop_string_over_the_limit_is_refused_naming_it():
    with api_server(engine_with(), "fake") as live:
        url = live.url + "/v1/completions"
        refused = httpx.post(url, json={**BODY, "stop": ["x" * (MAX_STOP_CHARS + 1)]})
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "stop" and f"the limit is {MAX_STOP_CHARS}" in error["message"]
        assert live.engine.step_count == 0
        allowed = httpx.post(url, json={**BODY, "stop": ["x" * MAX_STOP_CHARS]})
        assert allowed.status_code == 200


def test_a_slow_prompt_is_tokenized_off_the_engine_thread():
    with api_server(engine_with(SlowTokenizer(), step_s=0.01), "fake") as live:
        url = live.url + "/v1/completions"
        stamps: list[float] = []

        def stream() -> None:  # a running request: 250 tokens, a chunk each 10 ms
            body = {**BODY, "max_tokens": 250, "stream": True}
            with httpx.stream("POST", url, json=body, timeout=30) as reply:
                for _ in reply.iter_lines():
                    stamps.append(time.monotonic())

        running = threading.Thread(target=stream)
        running.start()
        while not stamps:
            time.sleep(0.01)
        slow = {**BODY, "prompt": "a long prompt to tokenize"}
        for _ in range(2):  # two seconds of tokenizing, meanwhile
            assert httpx.post(url, json=slow, timeout=30).status_code == 200
        running.join(30)
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert len(stamps) > 200 and max(gaps) < 0.5, max(gaps)  # in the engine thread: >= 1 s
