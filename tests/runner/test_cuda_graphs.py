"""CUDA-graph batch sizes and padding choices, and which steps the graph wrapper replays
(on CPU, with graphs that run the eager model); capture itself runs only on a CUDA device."""

import pytest
import torch

from minicb import LLM, EngineConfig, LLMEngine, SamplingParams
from minicb.core.runner.model_runner import ModelRunner
from minicb.cuda_graphs.capture import CudaGraphRunner, capture_sizes, padded_size


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


class EagerGraphs:
    """Stands in for captured graphs where none can be captured: a "replay" runs the eager
    model on the same inputs, and is counted."""

    def __init__(self, runner: ModelRunner, max_rows: int) -> None:
        self.runner, self.max_rows, self.replayed = runner, max_rows, 0

    def can_run(self, num_rows: int) -> bool:
        return num_rows <= self.max_rows

    def run(self, input_ids, positions, meta):
        self.replayed += 1
        r = self.runner
        return r.model(input_ids, positions, meta, r.kv_caches, r.backend)


def test_the_wrapper_replays_the_decode_steps_it_can_and_gives_the_eager_tokens(tiny_llama_dir):
    config = EngineConfig(device="cpu", dtype="float32", num_kv_blocks=32, max_num_seqs=4)
    prompts = [[5, 6, 7], [8] * 9, [9, 10], [11, 12, 13, 14]]
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (2, 8, 4, 10)]
    plain = ModelRunner(tiny_llama_dir, config)
    wrapped = CudaGraphRunner(plain.with_config(config))  # the same weights, its own KV
    assert wrapped.decode_graphs is None  # CPU: nothing captured (torch backend)
    wrapped.decode_graphs = graphs = EagerGraphs(wrapped.inner, max_rows=2)
    tokens = []
    for runner in (plain, wrapped):
        engine = LLMEngine(config=config, runner=runner)
        rids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        plans, outputs = [], {}
        while engine.has_unfinished():
            result = engine.step()
            plans.append(result.plan)
            outputs |= {out.request_id: out.token_ids for out in result.finished}
        tokens.append([outputs[rid] for rid in rids])
    assert tokens[0] == tokens[1]
    # Every decode-only step of at most two rows, and nothing else, was "replayed".
    decodes = [p for p in plans if p.scheduled and all(r.num_tokens == 1 for r in p.scheduled)]
    assert graphs.replayed == sum(len(p.scheduled) <= 2 for p in decodes) > 0


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
