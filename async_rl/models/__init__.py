"""Tiny models and tokenizers built in code, for tests and the CPU demo (nothing can be downloaded here)."""

from async_rl.models.tiny import DEFAULT_CHARSET, build_char_tokenizer, build_tiny_model

__all__ = ["DEFAULT_CHARSET", "build_char_tokenizer", "build_tiny_model"]
