"""Tensor parallelism on torch.distributed: shards, the process group and its workers."""
