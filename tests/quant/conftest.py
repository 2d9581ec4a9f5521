"""The Triton half of the 8-bit KV tests needs triton; where it cannot be imported (it
publishes wheels for Linux only) that file is not collected, as in tests/kernels/."""

from minicb.kernels import triton_missing

collect_ignore = ["test_kv_triton.py"] if triton_missing() else []
