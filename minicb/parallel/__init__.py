"""Tensor parallelism on torch.distributed: shards, the process group and its workers.

Rank 0's runner (tp_runner.py's ``TensorParallelRunner``) is registered at the runner seam
(minicb/core/runner/wrappers.py); its factory imports it, and torch.distributed, only when
``tensor_parallel_size`` > 1 asks for it.
"""

from minicb.core.feature_settings import register_settings
from minicb.core.runner.wrappers import register_wrapper
from minicb.parallel.settings import ParallelSettings


def _tensor_parallel_runner():
    from minicb.parallel.tp_runner import TensorParallelRunner

    return TensorParallelRunner


register_settings(ParallelSettings)
register_wrapper(
    "tensor_parallel",
    _tensor_parallel_runner,
    lambda config, device: ParallelSettings.of(config).tensor_parallel_size > 1,
)
