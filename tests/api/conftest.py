"""Fixtures for the API tests: a tiny-model server shared per module, token-id prompts."""

from __future__ import annotations

import pytest

from minicb import EngineConfig, LLMEngine
from tests.api.live import api_server


def tiny_engine(model_dir: str, **config) -> LLMEngine:
    """The tiny model's engine, in float32 as the offline references (tokens compared
    exactly; bfloat16's greedy tokens may differ at near-ties)."""
    config.setdefault("num_kv_blocks", 256)
    config.setdefault("dtype", "float32")
    return LLMEngine(model_dir, EngineConfig.from_kwargs(**config))


@pytest.fixture(scope="module")
def tiny_api(tiny_llama_dir):
    """The tiny random Llama (no tokenizer) behind the API, model name "tiny"."""
    with api_server(tiny_engine(tiny_llama_dir), "tiny") as live:
        yield live
