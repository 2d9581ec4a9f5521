"""The tokenizer's door (issue 54, M6): a prompt too long for the context by its length
alone is refused before it is tokenized, and a full tokenizer queue answers 429 naming
its limit. FakeRunner with a scripted tokenizer: no model."""

from __future__ import annotations

import threading

import httpx

from minicb import EngineConfig, FakeRunner, LLMEngine
from minicb.server.tokenizer_queue import longest_token
from tests.api.live import api_server
from tests.helpers import wait_for

CONTEXT = 256  # FakeRunner's max_model_len


class GatedTokenizer:
    """A vocabulary whose longest entry is 4 characters, and an encode that counts its
    calls and waits for ``gate`` (the tokenizer thread held, as a MiB of text holds it)."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "bb": 1, "cccc": 2}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls += 1
        assert self.gate.wait(10)
        return [5] * max(1, len(text) // 4)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "x" * len(ids)


def _server(tokenizer: GatedTokenizer, **options):
    runner = FakeRunner(num_kv_blocks=64, tokenizer=tokenizer)
    engine = LLMEngine(config=EngineConfig(num_kv_blocks=64), runner=runner)
    return api_server(engine, "fake", **options)


def _post(url: str, prompt: str) -> httpx.Response:
    body = {"model": "fake", "prompt": prompt, "max_tokens": 2}
    return httpx.post(url + "/v1/completions", json=body, timeout=30)


def test_a_prompt_longer_than_the_context_could_hold_is_refused_before_tokenizing():
    tokenizer = GatedTokenizer()
    assert longest_token(tokenizer) == 4
    with _server(tokenizer) as live:
        refused = _post(live.url, "a" * (CONTEXT * 4 + 1))
        assert refused.status_code == 400 and tokenizer.calls == 0, refused.text
        error = refused.json()["error"]
        assert error["param"] == "prompt" and f"the limit is {CONTEXT * 4} characters" in (
            error["message"]
        )
        # At the limit it may still fit (a token may cover fewer characters): tokenized,
        # then judged by the engine on its tokens.
        at_limit = _post(live.url, "a" * (CONTEXT * 4))
        assert tokenizer.calls == 1 and "256 tokens" in at_limit.json()["error"]["message"]
        assert _post(live.url, "a" * 40).status_code == 200


def test_a_full_tokenizer_door_answers_429_naming_its_limit():
    """Two texts of 40 characters fill a door of 100: a third text is refused, naming the
    characters waiting and the limit; once the thread frees, the door opens again."""
    tokenizer = GatedTokenizer()
    tokenizer.gate.clear()  # the thread is busy until the gate opens
    with _server(tokenizer, max_tokenizing_chars=100) as live:
        replies: list[httpx.Response] = []
        held = [threading.Thread(target=lambda: replies.append(_post(live.url, "a" * 40)))
                for _ in range(2)]  # fmt: skip
        for thread in held:
            thread.start()
        wait_for(lambda: live.app.state.openai.tokenizer.waiting_chars == 80)
        busy = _post(live.url, "a" * 40)
        assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
        error = busy.json()["error"]
        assert error["code"] == "tokenizer_busy", error
        assert "80 characters of text wait" in error["message"] and "limit of 100" in (
            error["message"]
        )
        tokenizer.gate.set()
        for thread in held:
            thread.join(30)
        assert [r.status_code for r in replies] == [200, 200]
        assert live.app.state.openai.tokenizer.waiting_chars == 0
        assert _post(live.url, "a" * 40).status_code == 200  # the door opens again


def test_many_short_texts_at_once_pass_the_door():
    """Fifty short prompts sent together (a class asking at once) queue a few thousand
    characters: none is refused, though all wait for one held thread."""
    tokenizer = GatedTokenizer()
    tokenizer.gate.clear()
    with _server(tokenizer) as live:
        replies: list[httpx.Response] = []
        held = [threading.Thread(target=lambda: replies.append(_post(live.url, "a" * 40)))
                for _ in range(50)]  # fmt: skip
        for thread in held:
            thread.start()
        wait_for(lambda: live.app.state.openai.tokenizer.waiting_chars == 50 * 40)
        tokenizer.gate.set()
        for thread in held:
            thread.join(30)
        assert sorted(r.status_code for r in replies) == [200] * 50
