"""One served model name in every mode (issues 52 and 54, the review's L6): the same
OpenAI client code, unchanged, against ``serve``, ``serve --replicas 2`` and
``serve --disaggregate 1:1`` on the tiny model. The model is given as a path relative to
the working directory, as a user types it: every mode serves it under that name (before,
the replicas and the disaggregated engines served the absolute folder it resolves to, so
a client using the name it was told got 400 ``model_not_found`` and learned the path).

Each mode's server is built in-process as the command builds it (``build_serve``); the
fleets start processes, so that test is slow.
"""

from __future__ import annotations

import os
import time

import openai
import pytest

from minicb.cli import build_parser
from minicb.server.serve_command import build_serve, served_name
from tests.api.live import live_server

MODES = {
    "one engine": [],
    "replicas": ["--replicas", "2"],
    "disaggregated": ["--disaggregate", "1:1"],
}
PROMPT = [5, 6, 7, 8, 9]


def parse(model: str, *extra: str):
    argv = ["serve", "--model", model, "--dtype", "float32", "--num-kv-blocks", "64"]
    return build_parser().parse_args([*argv, "--no-measure-utilisation", *extra])


def client_code(base_url: str, model: str) -> dict:
    """What a client written against one engine does: list the models, complete, stream
    (asking for the token ids too: the tiny model's text can be empty)."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    ids = [m.id for m in client.models.list()]
    ask = dict(model=model, prompt=PROMPT, max_tokens=5, temperature=0,
               extra_body={"ignore_eos": True, "return_token_ids": True})  # fmt: skip
    plain = client.completions.create(**ask)
    chunks = [c for c in client.completions.create(**ask, stream=True) if c.choices]
    return {
        "models": ids,
        "reply_model": plain.model,
        "tokens": plain.choices[0].model_extra["token_ids"],
        "streamed": [t for c in chunks for t in c.choices[0].model_extra.get("token_ids") or []],
    }


@pytest.mark.slow  # starts a server in each of the three modes: 14 s on an idle machine
def test_the_same_client_code_works_against_every_mode(tiny_llama_dir):
    relative = os.path.relpath(tiny_llama_dir)  # as typed: not the folder it resolves to
    assert not os.path.isabs(relative)
    seen = {}
    for mode, extra in MODES.items():
        args = parse(relative, *extra)
        assert served_name(args) == relative
        app, loop, engine, name = build_serve(args)
        loop.start()
        try:
            with live_server(app) as url:
                seen[mode] = client_code(url, relative)
                with pytest.raises(openai.BadRequestError) as refused:  # the folder's path
                    client_code(url, os.path.abspath(tiny_llama_dir))
                assert refused.value.code == "model_not_found"
        finally:
            loop.stop()
            if hasattr(engine, "close"):
                engine.close()
        assert name == relative, mode
    first = seen["one engine"]
    assert first["models"] == [relative] and first["reply_model"] == relative
    assert len(first["tokens"]) == 5 and first["tokens"] == first["streamed"]
    assert seen == dict.fromkeys(MODES, first)


def test_the_served_name_is_the_default_models_name_or_the_one_asked_for():
    assert served_name(parse("default")) == "SmolLM2-135M-Instruct"
    assert served_name(parse("default", "--replicas", "2")) == "SmolLM2-135M-Instruct"
    named = parse("default", "--disaggregate", "1:1", "--served-model-name", "smol")
    assert served_name(named) == "smol"


class NamedReplica:
    """A replica's stand-in that starts no process: what ``Fleet.__init__`` touches. Its
    own ``model_name`` is the folder it was given, as a real replica's is."""

    def __init__(self, index: int, path: str, config, **_options) -> None:  # noqa: ANN001
        self.index, self.name, self.model_name = index, f"replica{index}", path
        self.clock = time.time

    def ready(self) -> None:
        pass


def test_the_python_apis_fleets_call_the_model_as_the_server_does(
    tiny_llama_dir, monkeypatch, tmp_path
):
    """Fleet and DisaggregatedFleet name their model by the server's rule (before, a
    Fleet answered with the folder it resolved the model to)."""
    from minicb.fleet import fleet as fleet_module
    from tests.fleet.test_disaggregate_streams import scripted_fleet

    monkeypatch.setattr(fleet_module.Fleet, "replica_class", NamedReplica)
    relative = os.path.relpath(tiny_llama_dir)
    assert fleet_module.Fleet(relative, 2).model_name == relative
    # the default model: its name, not the cache folder it resolves to
    assert fleet_module.Fleet(None, 1).model_name == "SmolLM2-135M-Instruct"
    named = fleet_module.Fleet(relative, 1, served_model_name="smol")
    assert named.model_name == "smol"
    assert served_name(parse(relative)) == relative
    assert served_name(parse(relative, "--served-model-name", "smol")) == "smol"
    assert scripted_fleet(monkeypatch, tmp_path, 1, 1).model_name == "SmolLM2-135M-Instruct"
