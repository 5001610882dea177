"""The single exception type of the config package.

Every problem found while loading, merging, converting or cross-checking a config is a :class:`ConfigError`. It is a
``ValueError`` (user input is wrong) and its message always names the full dotted key(s) involved and what is allowed,
so a bad run is rejected at start-up with an actionable message instead of failing deep inside training.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid configuration; the message names the dotted key(s) and the allowed values or rule."""


__all__ = ["ConfigError"]
