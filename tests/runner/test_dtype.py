"""dtype "auto": bfloat16 where the hardware computes it natively, float32 elsewhere; an
explicit dtype always wins; the choice and its reason reach runner.describe()."""

import pytest
import torch

from minicb.core.config import EngineConfig
from minicb.core.runner.dtype import DTYPES, choose_dtype, cpu_capabilities
from minicb.core.runner.model_runner import ModelRunner
from minicb.engine_options import describe_choices

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object needs no GPU
LAPTOP = {"avx2": True, "avx512_bf16": False, "amx_bf16": False}  # AVX2 only, as most laptops
XEON_AMX = {"avx2": True, "avx512_bf16": True, "amx_bf16": True}
ZEN4 = {"avx2": True, "avx512_bf16": True}  # AVX-512 BF16, no AMX


def test_a_cpu_without_native_bf16_gets_float32():
    choice = choose_dtype("auto", CPU, LAPTOP)
    assert choice.dtype == torch.float32
    assert "AMX-BF16" in choice.reason and "AVX-512 BF16" in choice.reason  # what it lacks


@pytest.mark.parametrize(
    "caps, named",
    [(XEON_AMX, "AMX-BF16 and AVX-512 BF16"), (ZEN4, "AVX-512 BF16"), ({"amx_bf16": 1}, "AMX")],
)
def test_a_cpu_with_native_bf16_gets_bfloat16(caps, named):
    choice = choose_dtype("auto", CPU, caps)
    assert choice.dtype == torch.bfloat16
    assert named in choice.reason


def test_no_flags_at_all_gives_float32():
    assert choose_dtype("auto", CPU, {}).dtype == torch.float32


@pytest.fixture
def gpu_bf16(monkeypatch):
    """Whether the (pretend) GPU computes bf16 natively: Ampere and later do."""

    def pretend(native: bool) -> None:
        def is_bf16_supported(including_emulation: bool = True) -> bool:
            assert not including_emulation  # emulated bf16 is what auto must avoid
            return native

        monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)

    return pretend


def test_cuda_gets_bfloat16_whatever_the_cpu(gpu_bf16):
    gpu_bf16(True)
    choice = choose_dtype("auto", CUDA, LAPTOP)
    assert choice.dtype == torch.bfloat16 and "CUDA" in choice.reason


def test_a_gpu_without_native_bf16_gets_float16(gpu_bf16):
    gpu_bf16(False)  # a T4 or a V100
    choice = choose_dtype("auto", CUDA, XEON_AMX)
    assert choice.dtype == torch.float16 and "no native bf16" in choice.reason


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("device, caps", [(CPU, LAPTOP), (CPU, XEON_AMX), (CUDA, LAPTOP)])
def test_an_explicit_dtype_always_wins(name, device, caps):
    choice = choose_dtype(name, device, caps)
    assert choice.dtype == DTYPES[name]
    assert choice.name == name and choice.reason == "asked for"


def test_an_unknown_dtype_names_the_choices():
    with pytest.raises(ValueError, match="unknown dtype 'float8'.*float32, bfloat16, float16"):
        choose_dtype("float8", CPU, LAPTOP)


def test_flags_from_proc_cpuinfo_where_torch_has_no_capability_call(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 amx_bf16 amx_tile\n")
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    caps = cpu_capabilities(cpuinfo)
    assert caps["amx_bf16"] and caps["avx2"] and not caps.get("avx512_bf16")
    assert choose_dtype("auto", CPU, caps).dtype == torch.bfloat16
    assert cpu_capabilities(tmp_path / "absent") == {}  # nothing to read: float32 follows


@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_the_runner_computes_in_the_choice_and_reports_it(dtype, tiny_llama_dir):
    runner = ModelRunner(tiny_llama_dir, EngineConfig(dtype=dtype, num_kv_blocks=8, device="cpu"))
    choice = choose_dtype(dtype, CPU)  # this machine's own flags
    assert runner.model.lm_head.weight.dtype == choice.dtype
    assert runner.kv_cache.dtype == choice.dtype
    info = runner.describe()
    assert (info["dtype"], info["dtype_reason"]) == (choice.name, choice.reason)
    cfg = runner.model_config
    per_block = 2 * cfg.num_layers * 16 * cfg.num_kv_heads * cfg.head_dim * choice.dtype.itemsize
    assert info["bytes_per_block"] == per_block
    line = describe_choices(info)
    assert f"dtype {choice.name} ({choice.reason})" in line
    assert f"attention {info['attention_backend']} ({info['attention_reason']})" in line
    assert line.endswith("; forward eager")
