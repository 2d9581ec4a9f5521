"""Quantisation where it meets batching: fewer bytes per cached token, more requests per pool.

``kv.py``: the 8-bit KV cache (int8 or fp8 values, one fp32 scale per token and KV head),
its quantize/dequantize and the scale layout, read by both attention backends.
"""
