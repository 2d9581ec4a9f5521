"""minicb: continuous batching for LLM inference, small enough to read and fully instrumented.

The public names load lazily, so that ``import minicb.core.scheduler`` (pure Python) does not
pull in torch: the scheduler, block manager, requests, events and metrics stay readable
and testable on any machine.
"""

from importlib import import_module
from typing import Any

_PUBLIC = {
    "LLM": "minicb.llm",
    "EngineConfig": "minicb.core.config",
    "FakeRunner": "minicb.core.runner.fake",
    "LLMEngine": "minicb.core.engine",
    "RequestOutput": "minicb.core.request",
    "SamplingParams": "minicb.core.config",
    "StepResult": "minicb.core.engine",
    "TokenDelta": "minicb.core.request",
    "VirtualClock": "minicb.core.runner",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        import_module("minicb.features")  # each optional feature registers at its seam
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'minicb' has no attribute {name!r}")
