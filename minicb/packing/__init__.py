"""oneDNN-packed linear weights for CPUs with bf16 matmul units: a weight form at the model
build's seam (minicb/core/runner/wrappers.py), whose factory imports packed.py only when
``packed_weights`` asks for it in bfloat16 on a CPU."""

from minicb.core.feature_settings import register_settings
from minicb.core.runner.wrappers import register_weight_form
from minicb.packing.settings import PackingSettings


def _packed_weights():
    from minicb.packing.packed import PackedWeights

    return PackedWeights()


def _wanted(config, device, dtype) -> bool:
    return (
        PackingSettings.of(config).packed_weights
        and device.type == "cpu"
        and str(dtype) == "torch.bfloat16"
    )


register_settings(PackingSettings)
register_weight_form("packed_weights", _packed_weights, _wanted)
