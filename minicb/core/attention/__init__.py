"""Attention: a plain-torch reference, the torch path, and the registry of backends.

``get_backend(name, device)`` returns an object with ``store_kv`` and ``attention``;
the model calls only those two, so a backend can be swapped without touching it.

The names below are loaded on first use (PEP 562), not when the package is imported: a
feature registers its backend in backend_choice.py, which needs no torch, and importing
this package must not load torch for it.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "AttentionBackend": "minicb.core.attention.backend",
    "AttentionMetadata": "minicb.core.attention.backend",
    "get_backend": "minicb.core.attention.backend_choice",
}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
