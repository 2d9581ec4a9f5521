"""Triton kernels (paged decode and prefill attention, the KV store) and batch-invariant
matmuls: optional attention backends beside the core's torch path
(``minicb/core/attention/``), chosen by ``attention_backend``."""
