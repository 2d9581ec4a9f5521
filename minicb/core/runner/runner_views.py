"""What a model runner tells outsiders: where and how it computes, in words and numbers.

Trace headers, the page, the bench and the performance lab read ``runner.describe()``; a
request's step never calls it, so it is worded here, beside the runner, off the path a
student reads first. Each weight form and wrapper (wrappers.py) adds what it changes: the
int8 or packed layers, the tensor-parallel backend, the machine rates utilisation is
measured against, the compiled step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from minicb.core.runner.model_runner import ModelRunner


def describe(runner: ModelRunner) -> dict[str, Any]:
    """Where and how ``runner`` computes, JSON-safe, for trace headers and the visualizer."""
    dtype = runner.dtype_choice.name
    info: dict[str, Any] = {
        "runner": "model",
        "device": str(runner.device),
        "dtype": dtype,
        "dtype_reason": runner.dtype_choice.reason,
        "attention_backend": runner.backend.name,
        "attention_reason": runner.backend.reason,
        "weight_dtype": f"{dtype} (auto: the compute dtype)",
        "kv_cache_dtype": kv_dtype_name(runner.config.answer("KV format", "auto"), dtype),
        "num_kv_blocks": runner.num_kv_blocks,
        "bytes_per_block": runner.bytes_per_block(),
        "torch_threads": torch.get_num_threads(),
        "tensor_parallel_size": 1,  # one process; tensor parallelism's wrapper says more
        "linear": "plain",
        "compile": "eager",  # a wrapper that compiles (the lab's) says so in its own
    }
    for form in runner.weight_forms:  # int8 weights, packed layers: what each changes
        info |= form.describe()
    if runner.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(runner.device)
    return info


def kv_dtype_name(kv_cache_dtype: str, compute_dtype: str) -> str:
    """How the KV cache stores keys and values, in words (describe() and the page)."""
    if kv_cache_dtype == "auto":
        return f"{compute_dtype} (auto: the compute dtype)"
    return f"{kv_cache_dtype} (a scale per token and KV head)"
