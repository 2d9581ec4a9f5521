"""GPU check, section 3: the device's practical bandwidth and the decode kernel's share of it.

A large tensor copy gives the bandwidth the device really reaches; the paged decode-attention
kernel's bytes of K/V read per second are set against it, and its output against the plain
torch reference. ``dry`` selects toy sizes that run on CPU under the Triton interpreter.
"""

from __future__ import annotations

import time

import torch


def median_time(fn, device: torch.device, iters: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()``; CUDA events on a GPU, wall clock on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """GB/s of a large device copy, counting the bytes read and the bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = median_time(lambda: dst.copy_(src), device, iters=10)
    return 2 * nbytes / seconds / 1e9


def decode_bandwidth(
    device, batch, ctx, heads, kv_heads, head_dim, num_splits=None, *, dry: bool
) -> dict:
    """Time the decode kernel on a scattered paged cache; check it against the reference."""
    from minicb.core.attention import reference
    from minicb.core.attention.backend import AttentionMetadata
    from minicb.kernels.decode_attention import default_num_splits, paged_decode_attention

    dtype, block_size = torch.bfloat16, 16
    per_req = -(-ctx // block_size)
    tables = torch.randperm(batch * per_req, device=device).to(torch.int32).view(batch, per_req)
    k_cache = torch.randn(
        (batch * per_req, block_size, kv_heads, head_dim), dtype=dtype, device=device
    )
    v_cache = torch.randn_like(k_cache)
    query = torch.randn((batch, heads, head_dim), dtype=dtype, device=device)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    splits = num_splits or default_num_splits(batch, kv_heads, ctx, device)

    def run():
        return paged_decode_attention(
            query, k_cache, v_cache, tables, lens, head_dim**-0.5, ctx, num_splits=splits
        )

    seconds = median_time(run, device, iters=3 if dry else 20)
    meta = AttentionMetadata(
        torch.empty(0, dtype=torch.int64, device=device),
        tables,
        lens,
        torch.arange(batch + 1, dtype=torch.int32, device=device),
        1,
        ctx,
        [1] * batch,
        [ctx] * batch,
    )

    def ref_run():
        return reference.paged_decode_attention(query, k_cache, v_cache, meta, head_dim**-0.5)

    ref_seconds = median_time(ref_run, device, iters=3, warmup=1)
    err = (run().float() - ref_run().float()).abs().max().item()
    kv_bytes = 2 * batch * ctx * kv_heads * head_dim * k_cache.element_size()
    return {
        "shape": f"B={batch} ctx={ctx} H={heads}/{kv_heads} D={head_dim}",
        "splits": splits,
        "kv_MB": round(kv_bytes / 1e6, 1),
        "us": round(seconds * 1e6, 1),
        "GB_s": round(kv_bytes / seconds / 1e9, 1),
        "ref_us": round(ref_seconds * 1e6, 1),
        "max_abs_err": err,
    }


def bandwidth(device: torch.device, dry: bool) -> list[dict]:
    """The copy bandwidth, then the decode kernel on each shape as a share of it."""
    if dry:
        shapes = [(2, 100, 4, 1, 64, None), (1, 300, 4, 1, 64, 3)]
        copy_bytes = 2**20
    else:
        shapes = [
            (64, 4096, 32, 8, 128, None),  # Llama-8B-like heads, 1 GB of K/V
            (256, 2048, 9, 3, 64, None),  # SmolLM2-135M heads
            (2, 32768, 32, 8, 128, 1),  # long context, few requests: no split ...
            (2, 32768, 32, 8, 128, None),  # ... and the split chosen by default
        ]
        copy_bytes = 2**31
    copy_gbs = copy_bandwidth(device, copy_bytes)
    rows = [{"shape": "tensor copy (read + write)", "GB_s": round(copy_gbs, 1)}]
    for *shape, splits in shapes:
        row = decode_bandwidth(device, *shape, num_splits=splits, dry=dry)
        row["of_copy_bw"] = f"{row['GB_s'] / copy_gbs:.0%}"
        rows.append(row)
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return rows
