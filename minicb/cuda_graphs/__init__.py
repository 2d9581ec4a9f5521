"""CUDA graphs: decode steps captured once per batch size and replayed, by a runner wrapper
(capture.py's ``CudaGraphRunner``) registered at the runner seam
(minicb/core/runner/wrappers.py); the factory imports capture.py only when a config asks
for graphs on a CUDA device."""

from minicb.core.feature_settings import register_settings
from minicb.core.runner.wrappers import register_wrapper
from minicb.cuda_graphs.settings import CudaGraphSettings
from minicb.parallel.settings import ParallelSettings


def _graph_runner():
    from minicb.cuda_graphs.capture import CudaGraphRunner

    return CudaGraphRunner


def _wanted(config, device) -> bool:
    # Captured all-reduces would have to be replayed on every rank in step: one rank only.
    return (
        CudaGraphSettings.of(config).use_cuda_graphs
        and device.type == "cuda"
        and ParallelSettings.of(config).tensor_parallel_size == 1
    )


register_settings(CudaGraphSettings)
register_wrapper("cuda_graphs", _graph_runner, _wanted)
