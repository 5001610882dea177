"""Build a :class:`Config` from YAML files plus dotted command-line overrides.

Order: each YAML file (after its own ``defaults: [other.yaml, ...]`` includes, resolved relative to the file) is
deep-merged onto the previous ones; then ``a.b.c=value`` overrides are applied (values parsed as YAML, so lists,
``null`` and ``1e-6`` work; Hydra's ``+``/``++`` prefixes are accepted); then unknown keys are rejected with
suggestions, the dict is converted to the typed tree, and cross-field validation runs. Every failure is a
:class:`ConfigError` naming the dotted key.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from async_rl.config.errors import ConfigError
from async_rl.config.introspect import (
    Root,
    allowed_values,
    coerce,
    type_at,
    type_name,
    unknown_keys,
    with_section_defaults,
)
from async_rl.config.schema import Config
from async_rl.config.validate import validate_config

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=msgspec.Struct)
Validate = Callable[[T], list[str]]
"""Cross-field validation of a converted tree: raises ConfigError, returns the start-up warnings."""

_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# YAML 1.2-style floats: unlike PyYAML's YAML 1.1 rule, '1e-6' (no dot) is a float, as users expect.
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")


class _Loader(yaml.SafeLoader):
    """Safe YAML loader with YAML 1.2 floats and without implicit timestamps (dates stay strings)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_FLOAT_TAG, _TIMESTAMP_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text with the config loader; ``source`` names it in errors."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from exc


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """New dict: ``update`` merged onto ``base``; nested mappings merge, everything else (lists too) is replaced."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_yaml_file(path: str | Path, _stack: tuple[Path, ...] = ()) -> dict[str, Any]:
    """One YAML file as a dict, with its ``defaults`` includes merged underneath it (``_self_`` marks its position)."""
    file = Path(path).expanduser().resolve()
    if file in _stack:
        chain = " -> ".join(str(p) for p in (*_stack, file))
        raise ConfigError(f"config file include cycle: {chain}")
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror or exc}") from exc
    data = parse_yaml(text, str(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level of a config file must be a mapping, got {type(data).__name__}")
    includes = data.pop("defaults", None)
    if includes is None:
        return data
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"{path}: `defaults` must be a list of YAML file paths relative to this file")
    merged: dict[str, Any] = {}
    if "_self_" not in includes:
        includes = [*includes, "_self_"]
    for item in includes:
        part = data if item == "_self_" else load_yaml_file(file.parent / item, (*_stack, file))
        merged = deep_merge(merged, part)
    return merged


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``key=value`` (Hydra ``+``/``++`` prefixes stripped) and parse the value as a YAML scalar/flow node."""
    key, sep, raw = text.partition("=")
    key = key.strip().lstrip("+")
    if not sep:
        raise ConfigError(f"override {text!r} must look like dotted.key=value")
    if key.startswith("~"):
        raise ConfigError(f"override {text!r}: deleting keys (~key) is not supported; set the key to a value instead")
    if not _KEY_RE.match(key):
        raise ConfigError(f"override {text!r}: {key!r} is not a dotted key like data.train_batch_size")
    if raw == "":
        return key, ""
    try:
        value = yaml.load(raw, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except yaml.YAMLError:
        value = raw  # not valid YAML (e.g. "a: b: c"): take it literally as a string
    return key, value


def apply_override(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted ``key`` to ``value`` in the nested dict ``tree``, creating sections as needed."""
    node = tree
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            prefix = ".".join(parts[: depth + 1])
            raise ConfigError(f"override {key}: `{prefix}` is a value ({child!r}), not a section")
        node = child
    node[parts[-1]] = value


_MSGSPEC_ERR = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def _lookup(tree: Any, parts: list[str | int]) -> Any:
    for part in parts:
        try:
            tree = tree[part]
        except (KeyError, IndexError, TypeError):
            return None
    return tree


def _translate(exc: msgspec.ValidationError, raw: dict[str, Any], root: Root) -> ConfigError:
    """Rewrite a msgspec error ("... - at `$.a.b`") into one naming the dotted key, its type and allowed values."""
    match = _MSGSPEC_ERR.match(str(exc))
    assert match is not None
    path = match.group("path") or ""
    parts: list[str | int] = [name if name else int(idx) for name, idx in _PATH_PART.findall(path)]
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "<root>"
    got = _lookup(raw, parts)
    node = type_at(parts, root)
    msg = match.group("msg")
    if node is None:
        return ConfigError(f"config key `{key}`: {msg}")
    allowed = allowed_values(node)
    if msg.startswith("Invalid enum value") and allowed is not None:
        return ConfigError(f"config key `{key}`: invalid value {got!r}; allowed: {', '.join(map(repr, allowed))}")
    return ConfigError(f"config key `{key}`: expected {type_name(node)}, got {type(got).__name__} {got!r}")


def build_raw(paths: Sequence[str] | str | None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The merged plain dict from YAML files and overrides, before typing and validation."""
    if isinstance(paths, str):
        paths = [paths]
    tree: dict[str, Any] = {}
    for path in paths or ():
        tree = deep_merge(tree, load_yaml_file(path))
    for text in overrides:
        key, value = parse_override(text)
        apply_override(tree, key, value)
    return tree


def convert_to(raw: dict[str, Any], root: type[T]) -> T:
    """The typed tree of ``root`` from a plain dict: unknown keys, wrong types and bad enum values raise ConfigError.
    A section given in part keeps the defaults of its place in the tree for the keys it leaves out."""
    problems = unknown_keys(raw, root=root)
    if problems:
        raise ConfigError("\n".join(problems))
    try:
        return msgspec.convert(with_section_defaults(coerce(raw, root=root), root()), root, strict=False)
    except msgspec.ValidationError as exc:
        raise _translate(exc, raw, root) from None


def convert(raw: dict[str, Any]) -> Config:
    """Typed :class:`Config` from a plain dict (:func:`convert_to` with the RL training tree)."""
    return convert_to(raw, Config)


def load_tree_with_warnings(
    root: type[T], validate: Validate[T], paths: Sequence[str] | str | None, overrides: Sequence[str]
) -> tuple[T, list[str]]:
    """Load YAML files and overrides into ``root``'s tree and run ``validate`` on it; also return the start-up
    warnings (not logged). The one loader of every entry point's config tree."""
    cfg = convert_to(build_raw(paths, overrides), root)
    warnings = validate(cfg)
    return cfg, warnings


def load_config_with_warnings(
    paths: Sequence[str] | str | None = None, overrides: Sequence[str] = ()
) -> tuple[Config, list[str]]:
    """Load, convert, validate and resolve a config; also return the start-up warnings (not logged)."""
    return load_tree_with_warnings(Config, validate_config, paths, overrides)


def default_config() -> Config:
    """The defaults of every key as a validated, resolved Config (a fresh one each call; no warnings logged).

    Tests and tools that want "the defaults with a few changes" start from it and set attributes of its sections,
    which the learner, the rollout plane and the actor engine read as they are: defaults live in the config only.
    """
    return load_config_with_warnings()[0]


def load_config(paths: Sequence[str] | str | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load, convert, validate and resolve a config, logging each start-up warning once."""
    cfg, warnings = load_config_with_warnings(paths, overrides)
    for warning in warnings:
        logger.warning("config: %s", warning)
    return cfg


__all__ = [
    "apply_override",
    "Validate",
    "build_raw",
    "convert",
    "convert_to",
    "deep_merge",
    "default_config",
    "load_config",
    "load_config_with_warnings",
    "load_tree_with_warnings",
    "load_yaml_file",
    "parse_override",
    "parse_yaml",
]
