"""The Triton kernels' own tests need triton. Where it cannot be imported (Triton publishes
wheels for Linux only), their files are not collected, so the suite passes on macOS and
Windows; tests/kernels/test_without_triton.py checks the engine there instead."""

from minicb.kernels import triton_missing

NEED_TRITON = [
    "test_decode_attention.py",
    "test_engine_triton.py",
    "test_prefill_attention.py",
    "test_store_kv.py",
]
collect_ignore = NEED_TRITON if triton_missing() else []
