"""Triton is optional: in a Python where ``import triton`` fails, as on macOS or Windows
(Triton publishes Linux wheels only), every minicb module but the three Triton kernel files
imports, the engine runs on the torch backend with the same greedy tokens, "auto" says why
once, and an explicit "triton" is a clear error saying what is missing.

The subprocess gets a ``sitecustomize`` that sets ``sys.modules["triton"] = None``: then
``importlib.util.find_spec("triton")`` finds nothing and ``import triton`` raises
ModuleNotFoundError, exactly as where it is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minicb import LLM, SamplingParams

# The module fixture runs an engine in a fresh interpreter without triton.
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
KERNEL_FILES = {"minicb.kernels.decode_attention", "minicb.kernels.prefill_attention",
                "minicb.kernels.store_kv"}  # fmt: skip
PROMPTS = [[5, 17, 3, 99, 42, 7, 8], [11], [200, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]
OPTIONS = dict(dtype="float32", num_kv_blocks=32, block_size=4, max_num_batched_tokens=8)

# Runs in the subprocess, with the tiny model's folder as argv[1]; prints one JSON line.
SCRIPT = """
import contextlib, importlib, io, json, logging, pkgutil, sys
records = []
handler = logging.Handler()
handler.emit = lambda r: records.append(r.getMessage())
logging.getLogger("minicb").addHandler(handler)
logging.getLogger("minicb").setLevel(logging.INFO)

import minicb
failed = {}
for info in pkgutil.walk_packages(minicb.__path__, "minicb."):
    try:
        importlib.import_module(info.name)
    except ImportError as err:
        failed[info.name] = repr(err)

from minicb import LLM, SamplingParams
from minicb.cli import main
options = json.loads(sys.argv[2])
params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
llm = LLM(model=sys.argv[1], **options)
tokens = [o.token_ids for o in llm.generate(json.loads(sys.argv[3]), params)]
LLM(model=sys.argv[1], **options)  # a second engine: no second message
try:
    LLM(model=sys.argv[1], attention_backend="triton", **options)
    error = None
except RuntimeError as err:
    error = str(err)
stderr = io.StringIO()
with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
    rc = main(["generate", "x", "--model", sys.argv[1], "--attention-backend", "triton"])
print(json.dumps(dict(
    failed=failed, tokens=tokens, runner=llm.engine.describe()["runner"], records=records,
    error=error, cli_rc=rc, cli_stderr=stderr.getvalue(),
    triton_loaded=sys.modules.get("triton") is not None,
)))
"""


@pytest.fixture(scope="module")
def no_triton_path(tmp_path_factory) -> str:
    """A PYTHONPATH on which ``import triton`` fails, with this checkout's minicb."""
    shim = tmp_path_factory.mktemp("no_triton")
    (shim / "sitecustomize.py").write_text('import sys\nsys.modules["triton"] = None\n')
    return os.pathsep.join([str(shim), str(ROOT)])


@pytest.fixture(scope="module")
def without_triton(tiny_llama_dir, no_triton_path):
    env = dict(os.environ, PYTHONPATH=no_triton_path)
    env.pop("TRITON_INTERPRET", None)
    args = [tiny_llama_dir, json.dumps(OPTIONS), json.dumps(PROMPTS)]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_only_the_triton_kernel_files_need_triton(without_triton):
    assert set(without_triton["failed"]) == KERNEL_FILES, without_triton["failed"]
    assert all("triton" in err for err in without_triton["failed"].values())
    assert not without_triton["triton_loaded"]


def test_the_engine_runs_on_torch_with_the_same_tokens(without_triton, tiny_llama_dir):
    runner = without_triton["runner"]
    assert runner["attention_backend"] == "torch"
    assert "triton cannot be imported" in runner["attention_reason"]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    here = [o.token_ids for o in LLM(model=tiny_llama_dir, **OPTIONS).generate(PROMPTS, params)]
    assert without_triton["tokens"] == here


def test_auto_says_once_that_triton_is_missing(without_triton):
    said = [r for r in without_triton["records"] if "triton is not importable" in r]
    assert len(said) == 1, without_triton["records"]


def test_asking_for_triton_names_what_is_missing(without_triton):
    error = without_triton["error"]
    assert "needs the triton package" in error and "pip install triton" in error
    assert without_triton["cli_rc"] == 2
    cli_error = "minicb generate: error: attention_backend='triton' needs the triton package"
    assert cli_error in without_triton["cli_stderr"]


@pytest.mark.slow
def test_the_kernel_notebook_skips_what_needs_triton(no_triton_path, tmp_path, monkeypatch):
    """Notebook 6 top to bottom in a kernel without triton: it says so, and each of the five
    cells that launch a Triton kernel skips that part; the rest (listings, the reference,
    the exercises) runs."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    spec_dir = tmp_path / "kernels" / "no-triton"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "minicb without triton",
        "language": "python",
        "env": {"PYTHONPATH": no_triton_path},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    notebooks = ROOT / "notebooks"
    nb = nbformat.read(notebooks / "06_triton_kernels.ipynb", as_version=4)
    meta = {"metadata": {"path": str(notebooks)}}
    nbclient.NotebookClient(nb, kernel_name="no-triton", timeout=300, resources=meta).execute()
    text = "".join(
        out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    )
    assert "triton is not importable here" in text
    assert text.count("skipped: ") == 5, text
    assert "correct: your mask reproduces the reference's output" in text
