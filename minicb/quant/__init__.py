"""Quantisation where it meets batching: fewer bytes per cached token, more requests per pool.

``kv.py``: the 8-bit KV cache (int8 or fp8 values, one fp32 scale per token and KV head),
its quantize/dequantize and the scale layout, read by both attention backends.
``weights.py``: 8-bit weights (weight-only int8, a scale per output channel) for the
decoder's linear layers, computed by torch's own CPU kernel; fewer bytes per decode step,
registered here as a weight form at the model build's seam (minicb/core/runner/wrappers.py):
the factory imports weights.py, and torch, only when ``weight_dtype="int8"`` asks for it.
"""

from minicb.core.runner.wrappers import register_weight_form


def _int8_weights():
    from minicb.quant.weights import Int8Weights

    return Int8Weights()


register_weight_form("int8_weights", _int8_weights)
