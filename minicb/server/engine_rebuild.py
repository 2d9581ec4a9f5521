"""Rebuilding the demo's engines with new settings, refused before any engine is touched.

A browser's ``settings`` control (controls.py) asks for new engine settings. Every new
config is built first and weighed: its KV pools against the machine's free memory
(``check_memory``: a pool beyond it would take the machine down, not just the demo) and,
with the demo's workload, the workload's largest request against the new limits. Only
then is each engine replaced by one rebuilt on the same weights, clock and bus, so a
setting refused changes nothing.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from minicb.server.control_fields import ControlError
from minicb.server.demo_feeder import WorkloadFeeder

if TYPE_CHECKING:
    from minicb.driver.engine_loop import EngineLoop

MEMORY_SHARE = 0.8  # of the free memory a rebuild may ask for its KV pools


def rebuild_engines(
    loop: EngineLoop, changes: dict[str, Any], feeder: WorkloadFeeder | None = None
) -> list[dict[str, Any]]:
    """Rebuild every engine with ``changes`` on its weights, clock and bus (engine thread).

    Every new config is built, its KV pools weighed against the free memory and, with the
    demo's ``feeder``, its workload's largest request against the new limits, before any
    engine is touched, so a setting refused changes nothing. Then each old engine
    aborts its requests (their token streams end with "abort", the browsers see them
    leave) and the new one announces itself with a "reset" event on the same bus, in order
    with the events around it; the workload starts again on the new engines.
    """
    configs = {name: engine.config.with_(**changes) for name, engine in loop.engines.items()}
    check_memory(loop.engines, {name: c.num_kv_blocks for name, c in configs.items()})
    if feeder is not None:
        for name, config in configs.items():
            try:
                feeder.check_fits(loop.engines[name], config)
            except ValueError as err:
                raise ControlError(f"{err}; nothing was rebuilt") from err
    for name, config in configs.items():
        loop.replace_engine(name, loop.engines[name].rebuilt(config))
    if feeder is not None:
        feeder.configure(feeder.spec)
    return loop.engine_infos()


def check_memory(engines: dict[str, Any], blocks: dict[str, int | None]) -> None:
    """Refuse KV pools of ``blocks`` (engine name -> blocks) that the machine cannot hold.

    A runner that allocates real memory says how much a block takes (``bytes_per_block`` in
    its description; fakes and simulations allocate none). The new pools are built while
    the old ones are still held, so they must fit in what is free now, with room to spare;
    a swap twin as large as the pool lives in host memory, which on CPU is the same memory.
    """
    needed: dict[str, int] = {}
    for name, engine in engines.items():
        runner = engine.describe()["runner"]
        per_block = runner.get("bytes_per_block")
        if per_block is None or not blocks[name]:
            continue
        device = str(runner.get("device", "cpu")).split(":")[0]
        copies = 2 if device == "cpu" else 1  # the swap twin shares the memory on CPU
        needed[device] = needed.get(device, 0) + copies * blocks[name] * per_block
    for device, wanted in needed.items():
        free = _free_bytes(device)
        if wanted > MEMORY_SHARE * free:
            raise ControlError(
                f"num_kv_blocks={max(b or 0 for b in blocks.values())} needs "
                f"{wanted / 2**30:.2f} GiB of {device} memory for the KV pools of "
                f"{len(engines)} engine(s), over the limit of {MEMORY_SHARE:.0%} of the "
                f"{free / 2**30:.2f} GiB free; nothing was rebuilt"
            )


def _free_bytes(device: str) -> int:
    if device == "cuda":
        import torch  # only a runner on CUDA gets here, and it has imported torch

        return torch.cuda.mem_get_info()[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
