"""Attention kernels: a plain-torch reference and Triton kernels behind one interface.

``get_backend(name, device)`` returns an object with ``store_kv`` and ``attention``;
the model calls only those two, so a backend can be swapped without touching it.
"""

from minicb.core.attention.backend import AttentionBackend, AttentionMetadata
from minicb.core.attention.backend_choice import get_backend

__all__ = ["AttentionBackend", "AttentionMetadata", "get_backend"]
