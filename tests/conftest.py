"""Shared test set-up.

Triton reads TRITON_INTERPRET when it is first imported (loading a transformers model
imports it), so the interpreter switch for machines without a GPU is set here, before
anything else is imported.
"""

import os
import shutil

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama (GQA 4:2) saved as a Hugging Face folder, shared by the session."""
    from minicb.runner.loader import make_tiny_model_dir

    return str(make_tiny_model_dir("llama", tmp_path_factory.mktemp("tiny_llama"), seed=0))


@pytest.fixture(scope="session")
def default_llm():
    """The embedded default model in fp32 on CPU, loaded once (the first load builds the cache)."""
    from minicb import LLM

    return LLM(dtype="float32", num_kv_blocks=512, block_size=16)
