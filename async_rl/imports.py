"""Import a user's ``module:attr`` (a reward function, an environment class) named in config.

``module`` is a dotted module name or a path to a ``.py`` file (loaded under a name derived from its absolute path,
so the same file is one module). Every error is a ``ValueError`` naming ``what`` and the spec.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import zlib
from typing import Any


def import_attr(spec: str, *, what: str, form: str) -> Any:
    """The attribute ``spec`` names; ``what`` ("reward function", "environment") and ``form`` ("module:function")
    word the errors."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} must be given as {form!r}, got {spec!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        if not os.path.isfile(module_name):
            raise ValueError(f"{what} file not found: {module_name!r} (from {spec!r})")
        name = f"_async_rl_user_{zlib.crc32(os.path.abspath(module_name).encode()):08x}"
        mod_spec = importlib.util.spec_from_file_location(name, module_name)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"cannot import {what} file {module_name!r} (from {spec!r})")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import {what} module {module_name!r} (from {spec!r}): {exc}") from exc
    if not hasattr(module, attr):
        raise ValueError(f"{what} module {module_name!r} has no attribute {attr!r} (from {spec!r})")
    return getattr(module, attr)
