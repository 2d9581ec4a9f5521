"""The simulated demo's engines: static and continuous batching on simulated GPUs, the
picker's choices, and rebuilding both engines on another GPU.

``minicb demo --simulate GPU:MODEL`` (minicb/server/demo_command.py) runs the demo on
SimulatedRunner (minicb/sim/simulated_runner.py): no weights, the KV pool of that GPU,
predicted step times. Each engine has its own simulated GPU and its own VirtualClock, as two
machines side by side would; the engine loop's Pacer (minicb/driver/pacing.py) holds both to
the wall clock. The page's picker (minicb/server/controls.py's ``simulate``) moves both to
another catalogue profile.

With a host-time model (``host_time``: minicb/sim/host_time.py, the demo measures this
engine's own on start) each step also costs the host's seconds for its rows, so the page's
lanes show the device's idle share at a serving scale; with ``overlap_scheduling`` in the
config the simulated GPU hides that time behind the device's (the longer of the two), so
the page shows what overlap recovers. That overlap is modelled: the engine's own pipeline
(a worker thread, minicb/overlap/pipeline.py) is not run on a virtual clock that only its runner
moves, where the two threads' readings of the clock would race. Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minicb.core.engine import LLMEngine
from minicb.core.runner import VirtualClock
from minicb.cost_model.catalogue import load_profile, read_catalogue
from minicb.overlap.settings import OverlapSettings
from minicb.sim.host_time import HostTime
from minicb.sim.simulated_runner import SimulatedRunner

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig
    from minicb.driver.engine_loop import EngineLoop

# A serving engine's scale (vLLM's 256 slots; the pool sized from the GPU's memory), and a
# workload that keeps 256 rows busy on an H100 with an 8B model.
SIMULATED_DEFAULTS = dict(max_num_seqs=256, max_num_batched_tokens=2048, num_kv_blocks=None)
SIMULATED_WORKLOAD = dict(
    rate=60.0, burst=768, short=(16, 128), long=(256, 768), max_outstanding=2048
)


def simulated_engines(
    profile_name: str, configs: dict[str, EngineConfig], host_time: HostTime | None = None
) -> dict[str, LLMEngine]:
    """One engine per config (name -> config), each on its own simulated GPU and clock;
    with ``host_time``, the host's time per step counted too, and overlap scheduling
    modelled where a config asks for it (the module docstring)."""
    profile = load_profile(profile_name)
    engines = {}
    for name, config in configs.items():
        clock = VirtualClock()
        overlap = host_time is not None and OverlapSettings.of(config).overlap_scheduling
        if overlap:
            config = config.with_(overlap_scheduling=False)  # modelled by the runner instead
        runner = SimulatedRunner(profile, config, clock=clock, host=host_time, overlap=overlap)
        engines[name] = LLMEngine(config=config, runner=runner, clock=clock)
    return engines


def simulation_choices(loop: EngineLoop | None) -> dict[str, Any] | None:
    """The catalogue's GPUs and models, the profile now simulated and the speed factor,
    for the page's picker; None unless the engines run on a simulated GPU (read in the
    engine thread)."""
    infos = loop.engine_infos() if loop else []
    runner = next((i["runner"] for i in infos if i.get("simulated")), None)
    if loop is None or runner is None:
        return None
    catalogue = read_catalogue()
    return {
        "gpus": list(catalogue["gpus"]),
        "models": list(catalogue["models"]),
        "gpu": runner.get("gpu"),
        "model": runner.get("model"),
        "speed": loop.pacer.speed if loop.pacer else None,
    }


def resimulate(loop: EngineLoop, profile_name: str) -> list[dict[str, Any]]:
    """Rebuild every engine on a simulated GPU of ``profile_name``, its KV pool sized for
    that GPU unless the settings fix it, with the same clock and bus (engine thread). Every
    runner is built before any engine is touched, so a profile refused changes nothing."""
    profile = load_profile(profile_name)
    runners = {
        name: SimulatedRunner(
            profile,
            engine.config,
            clock=engine.clock,
            host=getattr(engine.runner, "host", None),  # the host-time model stays
            overlap=getattr(engine.runner, "overlap", False),
        )
        for name, engine in loop.engines.items()
    }
    for name, runner in runners.items():
        engine = loop.engines[name]
        loop.replace_engine(name, engine.rebuilt(engine.config, runner=runner))
    return loop.engine_infos()
