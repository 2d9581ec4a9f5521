"""oneDNN-packed linear weights for CPUs with bf16 matmul units."""
