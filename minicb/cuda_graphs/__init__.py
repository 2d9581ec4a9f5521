"""CUDA graphs: decode steps captured once per batch size and replayed."""
