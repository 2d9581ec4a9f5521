"""Triton kernels (paged decode and prefill attention, the KV store) and batch-invariant
matmuls: optional attention backends beside the core's torch path
(``minicb/core/attention/``), chosen by ``attention_backend``.

Importing this package registers the "triton" and "batch_invariant" backends in the core's
registry (``minicb.core.attention.backend_choice.BACKENDS``) and batch invariance's row-tiled
linears as a weight form (``minicb.core.runner.wrappers``), and nothing more: each factory
imports its module (triton_backend.py, and that the kernels and Triton; batch_invariant.py)
only when a config asks for it, so ``import minicb.features`` stays cheap and works where
Triton is not installed.
"""

from __future__ import annotations

from minicb.core.attention.backend_choice import BACKENDS, BackendEntry, package_missing
from minicb.core.feature_settings import register_settings
from minicb.core.runner.wrappers import register_weight_form
from minicb.kernels.settings import BatchInvariantSettings

TRITON_HINT = (
    "Triton publishes wheels for Linux only: `pip install triton` there, "
    "or use attention_backend='torch' (what 'auto' picks without it)"
)


def triton_missing() -> str | None:
    """Why triton cannot be imported here, or None if it can (the tests and notebook 6 skip
    what needs it)."""
    return package_missing("triton")


def _triton_backend(reason: str):
    from minicb.kernels.triton_backend import TritonBackend

    return TritonBackend(reason)


def _auto_on_cuda(device) -> tuple[bool, str]:
    if device.type == "cuda":
        return True, "Triton kernels on CUDA"
    return False, "on CPU Triton would run only under its slow interpreter"


BACKENDS["triton"] = BackendEntry(
    _triton_backend, package="triton", hint=TRITON_HINT, auto=_auto_on_cuda
)


def _batch_invariant_backend(reason: str):
    from minicb.kernels.batch_invariant import BatchInvariantBackend

    return BatchInvariantBackend()  # its own reason: what makes it batch-invariant


def _row_tiles():
    from minicb.kernels.batch_invariant import RowTiles

    return RowTiles()


BACKENDS["batch_invariant"] = BackendEntry(_batch_invariant_backend)  # ``batch_invariant``
register_settings(BatchInvariantSettings)
register_weight_form(
    "batch_invariant",
    _row_tiles,
    lambda config, device, dtype: BatchInvariantSettings.of(config).batch_invariant,
)
