"""The catalogue of GPUs and model shapes the simulated runner can be, and the profile names.

The figures live in one data file, ``catalogue.json`` beside this module (published
numbers; docs/simulation.md cites each source). A profile is named ``GPU:MODEL``, e.g.
``H100-SXM:llama-3.1-8b``; names match without regard to case, and a GPU may be given by
a prefix that only one entry has (``H100``). MODEL may also be a local model folder or its
``config.json``: the shape is then read from the Hugging Face config. Pure Python.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from minicb.cost_model.step_time import GIB, Efficiency, GPUSpec, ModelShape, StepTimeModel

CATALOGUE_FILE = Path(__file__).with_name("catalogue.json")


@cache
def read_catalogue() -> dict[str, Any]:
    return json.loads(CATALOGUE_FILE.read_text(encoding="utf-8"))


def _pick(kind: str, name: str, table: dict[str, Any]) -> str:
    """The entry of ``table`` that ``name`` means: exact (any case), else a unique prefix."""
    by_lower = {k.lower(): k for k in table}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    hits = [k for k in table if k.lower().startswith(name.lower())]
    if len(hits) == 1:
        return hits[0]
    what = f"matches {', '.join(hits)}" if hits else "is not in the catalogue"
    raise ValueError(f"{kind} {name!r} {what}; choose one of {', '.join(table)}")


def gpu_spec(name: str) -> GPUSpec:
    gpus = read_catalogue()["gpus"]
    key = _pick("GPU", name, gpus)
    g = gpus[key]
    return GPUSpec(
        name=key,
        memory_bytes=g["memory_gib"] * GIB,
        bandwidth=g["hbm_gb_s"] * 1e9,
        flops=g["bf16_tflops"] * 1e12,
        interconnect=g["interconnect_gb_s"] * 1e9,
        host_link=g.get("host_link_gb_s", 0.0) * 1e9,
    )


def efficiency(**overrides: float) -> Efficiency:
    """The catalogue's efficiency factors, with any of them replaced."""
    return Efficiency(**{**read_catalogue()["efficiency"], **overrides})


def shape_from_hf_config(raw: dict[str, Any], name: str) -> ModelShape:
    """A model shape from a Hugging Face ``config.json`` (Llama, Mistral, Qwen2/3, OPT)."""
    opt = raw.get("model_type") == "opt"
    try:
        heads = raw["num_attention_heads"]
        hidden = raw["hidden_size"]
        return ModelShape(
            name=name,
            num_layers=raw["num_hidden_layers"],
            hidden_size=hidden,
            intermediate_size=raw["ffn_dim"] if opt else raw["intermediate_size"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            vocab_size=raw["vocab_size"],
            max_model_len=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=raw.get("tie_word_embeddings", opt),
            gated_mlp=not opt,
        )
    except KeyError as err:
        raise ValueError(f"config of {name!r} lacks {err.args[0]!r}") from err


def model_shape(name: str) -> ModelShape:
    """A catalogue model, or the shape in a local folder's (or file's) ``config.json``."""
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return shape_from_hf_config(json.loads(path.read_text()), path.parent.name)
    models = read_catalogue()["models"]
    key = _pick("model", name, models)
    return ModelShape(name=key, **models[key])


def load_profile(spec: str, tensor_parallel_size: int = 1) -> StepTimeModel:
    """The step-time model named ``GPU:MODEL`` (e.g. ``H100:llama-3.1-8b``) in bf16."""
    gpu, sep, model = spec.partition(":")
    if not sep or not gpu or not model:
        raise ValueError(
            f"profile {spec!r} must be GPU:MODEL, e.g. H100-SXM:llama-3.1-8b; GPUs: "
            f"{', '.join(read_catalogue()['gpus'])}; models: "
            f"{', '.join(read_catalogue()['models'])} or a model folder"
        )
    if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size!r}")
    return StepTimeModel(gpu_spec(gpu), model_shape(model), efficiency(), tp=tensor_parallel_size)
