"""CUDA graphs: decode steps captured once per batch size and replayed, by a runner wrapper
(capture.py's ``CudaGraphRunner``) registered at the runner seam
(minicb/core/runner/wrappers.py); the factory imports capture.py only when a config asks
for graphs on a CUDA device."""

from minicb.core.runner.wrappers import register_wrapper


def _graph_runner():
    from minicb.cuda_graphs.capture import CudaGraphRunner

    return CudaGraphRunner


register_wrapper("cuda_graphs", _graph_runner)
