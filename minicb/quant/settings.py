"""Quantisation's settings (its record in ``EngineConfig.features``).

``kv_cache_dtype``: how keys and values are stored (kv.py): "auto" in the compute dtype;
"int8" or "fp8" (float8_e4m3fn) in one byte each with a scale per token and KV head, so the
same memory holds about twice the blocks (and the batch can grow). The core's KV layer seam
learns it as ``config.answer("KV format", "auto")``.
``weight_dtype``: how the decoder's linear weights are held (weights.py): "auto" in the
compute dtype; "int8" weight-only, a scale per output channel (a quarter of fp32's bytes).
Activations and arithmetic stay in the compute dtype; LM head untouched. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from minicb.core.feature_settings import FeatureSettings, check_choice
from minicb.parallel.settings import ParallelSettings

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
WEIGHT_DTYPES = ("auto", "int8")


@dataclass(frozen=True)
class QuantSettings(FeatureSettings):
    name: ClassVar[str] = "quant"
    answers: ClassVar[dict[str, str]] = {"KV format": "kv_cache_dtype"}

    kv_cache_dtype: str = "auto"
    weight_dtype: str = "auto"

    def __post_init__(self) -> None:
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        check_choice("weight_dtype", self.weight_dtype, WEIGHT_DTYPES)

    def check(self, config: EngineConfig) -> None:
        if self.weight_dtype != "auto" and ParallelSettings.of(config).tensor_parallel_size > 1:
            raise ValueError("weight_dtype int8 is not built for tensor_parallel_size > 1")
