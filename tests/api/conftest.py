"""Fixtures for the API tests: a tiny-model server shared per module, token-id prompts."""

from __future__ import annotations

import pytest

from minicb import EngineConfig, LLMEngine
from tests.api.live import api_server


def tiny_engine(model_dir: str, **config) -> LLMEngine:
    config.setdefault("num_kv_blocks", 256)
    return LLMEngine(model_dir, EngineConfig(**config))


@pytest.fixture(scope="module")
def tiny_api(tiny_llama_dir):
    """The tiny random Llama (no tokenizer) behind the API, model name "tiny"."""
    with api_server(tiny_engine(tiny_llama_dir), "tiny") as live:
        yield live
