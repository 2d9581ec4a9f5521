"""Quantisation where it meets batching: fewer bytes per cached token, more requests per pool.

``kv.py``: the 8-bit KV cache (int8 or fp8 values, one fp32 scale per token and KV head),
its quantize/dequantize and the scale layout, read by both attention backends.
``weights.py``: 8-bit weights (weight-only int8, a scale per output channel) for the
decoder's linear layers, computed by torch's own CPU kernel; fewer bytes per decode step.

Importing this package registers the 8-bit KV formats at the core's KV layer seam
(``KV_FORMATS`` in minicb/core/attention/kv_layer.py) under their ``kv_cache_dtype`` names,
and the int8 weights as a weight form at the model build's seam
(minicb/core/runner/wrappers.py), and nothing more: each factory imports kv.py or weights.py,
and with it torch, only when a pool of that format is allocated or ``weight_dtype="int8"``
asks for int8 weights.
"""

from __future__ import annotations

from functools import partial

from minicb.core.attention.kv_layer import KV_FORMATS
from minicb.core.feature_settings import register_settings
from minicb.core.runner.wrappers import register_weight_form
from minicb.quant.settings import QuantSettings


def _eight_bit(name: str):
    from minicb.quant.kv import EightBitKV

    return EightBitKV(name)


for _name in ("int8", "fp8"):
    KV_FORMATS[_name] = partial(_eight_bit, _name)


def _int8_weights():
    from minicb.quant.weights import Int8Weights

    return Int8Weights()


register_settings(QuantSettings)
register_weight_form(
    "int8_weights",
    _int8_weights,
    lambda config, device, dtype: QuantSettings.of(config).weight_dtype == "int8",
)
