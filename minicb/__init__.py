"""minicb: continuous batching for LLM inference, small enough to read and fully instrumented."""

from minicb.config import EngineConfig
from minicb.engine import LLMEngine
from minicb.llm import LLM
from minicb.outputs import RequestOutput, StepResult, TokenDelta
from minicb.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "EngineConfig",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "StepResult",
    "TokenDelta",
]
