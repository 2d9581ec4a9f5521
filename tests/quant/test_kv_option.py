"""kv_cache_dtype as an engine option: validated with the choices named, and on the
command line of every subcommand that builds an engine."""

from __future__ import annotations

import argparse

import pytest
import torch

from minicb.core.config import EngineConfig
from minicb.engine_options import add_engine_options, engine_kwargs
from minicb.quant.settings import QuantSettings


def test_an_unknown_kv_cache_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="kv_cache_dtype 'int4'; choose one of auto, int8, fp8"):
        EngineConfig.from_kwargs(kv_cache_dtype="int4")
    assert QuantSettings.of(EngineConfig()).kv_cache_dtype == "auto"


@pytest.mark.parametrize("value", ["auto", "int8", "fp8"])
def test_the_command_line_option_reaches_the_config(value):
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    args = parser.parse_args(["--kv-cache-dtype", value])
    assert QuantSettings.of(EngineConfig.from_kwargs(**engine_kwargs(args))).kv_cache_dtype == value


def test_a_format_nobody_registered_names_import_minicb_features(monkeypatch):
    """The core's KV layer seam knows only the plain format; 8-bit registers from
    minicb/quant/__init__.py, and a pool asked for an unregistered one says what to import."""
    from minicb.core.attention.kv_layer import KV_FORMATS
    from minicb.core.registry import FeatureNotLoaded
    from minicb.core.runner.kv_pool import KVPool

    monkeypatch.delitem(KV_FORMATS, "int8")
    with pytest.raises(FeatureNotLoaded, match="import minicb.features") as refused:
        KVPool.allocate(2, (4, 2, 8), 3, "int8", torch.float32, "cpu")
    assert (refused.value.seam, refused.value.name) == ("KV format", "int8")
    assert KVPool.allocate(2, (4, 2, 8), 3, "auto", torch.float32, "cpu").values.shape[2] == 3
