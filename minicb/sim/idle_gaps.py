"""The device's idle gaps at a GPU's scale, and what overlap scheduling recovers (SIMULATED).

A simulated run gives each step's device seconds; ``host_time.replay`` adds the host's
work around them, without and with overlap. ``at_scale`` puts the two together at the
scale where the gaps matter. It sits in its own file, above ``run.py``, because it runs a
workload: ``host_time.py`` is read by ``SimulatedRunner`` (``runner.py``), which
``run.py`` builds, so a run inside ``host_time.py`` would close an import cycle.

    .venv/bin/python -c "from minicb.sim.idle_gaps import at_scale; print(at_scale(1.0))"

Pure Python: no torch.
"""

from __future__ import annotations

from typing import Any

from minicb.core.config import EngineConfig
from minicb.cost_model.catalogue import load_profile
from minicb.sim.host_time import HostTime, measure_engine_host_time, published_host_time, replay
from minicb.sim.run import run_simulated
from minicb.workload import exponential_lengths, from_lengths, lognormal_lengths


def at_scale(
    size: float = 1.0, profile_name: str = "H100:llama-3.1-8b", host: HostTime | None = None
) -> dict[str, Any]:
    """The idle gaps at a GPU's scale and what overlap recovers: continuous batching at 256
    slots on the simulated GPU (paper_reproductions.scale's workload: everyone at once, prompts
    and outputs of mean 256), its device times replayed with this engine's host time
    (``host``, measured now if not given) and with vLLM v0.5.3's published share."""
    n = max(16, round(1024 * size))
    reqs = from_lengths(
        lognormal_lengths(n, 256, 0.8, 2048, seed=6), exponential_lengths(n, 256, 2048, seed=7)
    )
    config = EngineConfig(max_num_seqs=min(256, n), max_num_batched_tokens=2048,
                          enable_prefix_caching=False)  # fmt: skip
    run = run_simulated(load_profile(profile_name), config, reqs, keep_steps=True)
    steps = [(s["forward_s"], int(s["rows"])) for s in run["steps"]]
    device = sum(d for d, _ in steps)
    mean_rows = sum(r for _, r in steps) / len(steps)
    hosts = [
        host or measure_engine_host_time(),
        published_host_time(device / len(steps), mean_rows),
    ]
    return {
        "setup": f"{profile_name} (simulated), {n} requests at once, continuous batching, "
        f"{config.max_num_seqs} slots; mean batch {mean_rows:.0f} rows",
        "host_models": [vars(h) for h in hosts],
        "replays": [replay(steps, h) for h in hosts],
    }
