"""minicb: continuous batching for LLM inference, small enough to read and fully instrumented.

The public names load lazily, so that ``import minicb.scheduler`` (pure Python) does not
pull in torch: the scheduler, block manager, requests, events and metrics stay readable
and testable on any machine.
"""

from importlib import import_module
from typing import Any

_PUBLIC = {
    "LLM": "minicb.llm",
    "EngineConfig": "minicb.config",
    "FakeRunner": "minicb.runner.fake",
    "LLMEngine": "minicb.engine",
    "RequestOutput": "minicb.request",
    "SamplingParams": "minicb.config",
    "StepResult": "minicb.engine",
    "TokenDelta": "minicb.request",
    "VirtualClock": "minicb.runner",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'minicb' has no attribute {name!r}")
