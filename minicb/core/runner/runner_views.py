"""The model runner's views: where and how it computes, told to whoever is outside it.

Trace headers, the page, the bench and the performance lab ask a ``ModelRunner`` what it
runs on (its device, dtypes, attention backend, KV block size) through these methods.
``ModelRunner`` (minicb/core/runner/model_runner.py) inherits them; a request's step never
calls them, so they sit beside the runner, off the path a student reads first, as the
engine's views sit in ``minicb/core/engine_views.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from minicb.core.runner.kv_setup import block_bytes
from minicb.packing.packed import PackedLinear

if TYPE_CHECKING:
    from minicb.core.attention import AttentionBackend
    from minicb.core.config import EngineConfig
    from minicb.core.runner.dtype import DtypeChoice
    from minicb.core.runner.llama import LlamaModel, ModelConfig
    from minicb.core.runner.loader import ModelFiles
    from minicb.utilisation.occupancy import Occupancy


class ModelRunnerViews:
    """The read-only views of ``ModelRunner``: words and numbers, JSON-safe."""

    # What the views read, set by ModelRunner.__init__.
    config: EngineConfig
    files: ModelFiles
    model: LlamaModel
    model_config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    dtype_choice: DtypeChoice
    backend: AttentionBackend
    num_kv_blocks: int
    occupancy: Occupancy | None
    tp: Any  # rank 0's handle on its workers (tp_group.TPGroup), None without them

    def describe(self) -> dict[str, Any]:
        """Where and how it computes, for trace headers and the visualizer."""
        info: dict[str, Any] = {
            "runner": "model",
            "device": str(self.device),
            "dtype": self.dtype_choice.name,
            "dtype_reason": self.dtype_choice.reason,
            "attention_backend": self.backend.name,
            "attention_reason": self.backend.reason,
            "weight_dtype": self.weight_dtype_name(),
            "kv_cache_dtype": self.kv_dtype_name(),
            "num_kv_blocks": self.num_kv_blocks,
            "bytes_per_block": self.bytes_per_block(),
            "torch_threads": torch.get_num_threads(),
            "tensor_parallel_size": self.config.tensor_parallel_size,
            "linear": "onednn-packed" if isinstance(self.model.lm_head, PackedLinear) else "plain",
            "compile": "eager",  # a wrapper that compiles (the lab's) says so in its own
        }
        if self.tp is not None:
            info["tensor_parallel_backend"] = self.tp.backend
        if self.occupancy is not None:  # what the page's utilisation chart is measured against
            info["machine_rates"] = self.occupancy.rates.describe()
        if self.device.type == "cuda":
            info["gpu"] = torch.cuda.get_device_name(self.device)
        return info

    def weight_dtype_name(self) -> str:
        """How the decoder's linear weights are held, in words (describe())."""
        if self.config.weight_dtype == "auto":
            return f"{self.dtype_choice.name} (auto: the compute dtype)"
        return "int8 (a scale per output channel; LM head and embedding unquantised)"

    def kv_dtype_name(self) -> str:
        """How the KV cache stores keys and values, in words (describe() and the page)."""
        if self.config.kv_cache_dtype == "auto":
            return f"{self.dtype_choice.name} (auto: the compute dtype)"
        return f"{self.config.kv_cache_dtype} (a scale per token and KV head)"

    def bytes_per_block(self) -> int:
        """Bytes of one block in every layer (keys, values and any scales): an 8-bit KV
        cache's block is about half a bf16 one, so a byte budget holds about twice as many."""
        return block_bytes(self.config, self.model_config, self.dtype)

    @property
    def model_path(self) -> str:
        """The folder the weights and config.json were read from."""
        return str(self.files.path)
