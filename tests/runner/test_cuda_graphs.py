"""CUDA-graph batch sizes and padding choices; capture itself runs only on a CUDA device."""

import pytest
import torch

from minicb import LLM, SamplingParams
from minicb.cuda_graphs.capture import capture_sizes, padded_size


def test_capture_sizes_cover_every_batch_up_to_max_num_seqs():
    assert capture_sizes(1) == [1]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = capture_sizes(64)
    assert all(padded_size(b, sizes) is not None for b in range(1, 65))
    assert padded_size(65, sizes) is None
    assert [padded_size(b, sizes) for b in (1, 3, 5, 9, 63)] == [1, 4, 8, 16, 64]


def test_no_graphs_on_cpu(tiny_llama_dir):
    # The device is named: "auto" picks CUDA where there is one, and graphs would be built.
    llm = LLM(model=tiny_llama_dir, device="cpu", num_kv_blocks=16, use_cuda_graphs=True)
    assert getattr(llm.engine.runner, "decode_graphs", None) is None  # not even wrapped


@pytest.mark.gpu
def test_graph_replay_gives_the_eager_tokens(tiny_llama_dir):
    assert torch.cuda.is_available()
    prompts = [[5, 6, 7], [8] * 20, [9, 10]]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    opts = dict(model=tiny_llama_dir, device="cuda", dtype="float32", attention_backend="triton")
    eager = LLM(**opts, use_cuda_graphs=False).generate(prompts, params)
    graphed_llm = LLM(**opts, use_cuda_graphs=True, max_num_seqs=8)
    assert graphed_llm.engine.runner.decode_graphs is not None
    graphed = graphed_llm.generate(prompts, params)
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]
