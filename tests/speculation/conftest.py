"""Fixtures of the proposer tests: a second tiny Llama with the target's vocabulary (other
weights: a draft that is often wrong) and one with another vocabulary."""

import pytest


@pytest.fixture(scope="session")
def other_llama_dir(tmp_path_factory):
    from minicb.tiny_models import make_tiny_model_dir

    return str(make_tiny_model_dir("llama", tmp_path_factory.mktemp("other_llama"), seed=1))


@pytest.fixture(scope="session")
def wide_llama_dir(tmp_path_factory):
    from minicb.tiny_models import make_tiny_model_dir

    folder = tmp_path_factory.mktemp("wide_llama")
    return str(make_tiny_model_dir("llama", folder, seed=2, vocab_size=300))
