"""Which attention backend runs, and why: chosen once, when the runner is built.

"auto" takes Triton on CUDA and the torch backend on CPU (where Triton would only run under
its slow interpreter). Triton is optional (it publishes wheels for Linux only): without it
"auto" takes the torch backend on CUDA too and logs why once, and an explicit "triton" is
refused with an error saying what is missing. Each backend carries a ``reason`` in words,
which ``runner.describe()`` reports.
"""

from __future__ import annotations

import importlib.util
import logging
from functools import cache

import torch

from minicb.core.attention.backend import AttentionBackend, TorchBackend

log = logging.getLogger(__name__)
TRITON_HINT = (
    "Triton publishes wheels for Linux only: `pip install triton` there, "
    "or use attention_backend='torch' (what 'auto' picks without it)"
)


def triton_missing() -> str | None:
    """Why triton cannot be imported here, or None if it can. The module is looked up, not
    imported: importing it fixes Triton's interpreter switch for the whole process."""
    try:
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError) as err:  # a blocked or broken installation
        return str(err) or type(err).__name__
    return None if found else "No module named 'triton'"


@cache
def _say_once(device_type: str, why: str) -> None:
    message = f"triton is not importable ({why}): attention runs on the torch backend"
    # On CUDA that costs speed, so warn; on CPU "auto" takes torch anyway.
    log.log(logging.WARNING if device_type == "cuda" else logging.INFO, message)


def get_backend(name: str, device: torch.device) -> AttentionBackend:
    """The backend for ``name`` ("auto", "torch" or "triton") on ``device``."""
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"unknown attention_backend {name!r}; choose auto, torch or triton")
    missing = triton_missing() if name != "torch" else None
    if name == "triton":
        if missing:
            raise RuntimeError(
                f"attention_backend='triton' needs the triton package, which cannot be "
                f"imported here ({missing}). {TRITON_HINT}"
            )
        from minicb.kernels.triton_backend import TritonBackend

        return TritonBackend()
    if name == "torch":
        return TorchBackend()
    if missing:
        _say_once(device.type, missing)
        return TorchBackend(f"auto: triton cannot be imported here: {missing}")
    if device.type == "cuda":
        from minicb.kernels.triton_backend import TritonBackend

        return TritonBackend("auto: Triton kernels on CUDA")
    return TorchBackend("auto: on CPU Triton would run only under its slow interpreter")
