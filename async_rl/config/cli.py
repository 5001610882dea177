"""Printing and command-line helpers: resolved-config dump, ``--help`` text and a tiny argv parser for entry points.

``parse_cli`` understands ``--config FILE`` (repeatable, merged in order), ``--help``/``-h``, ``--print-config``,
``--dry-run`` and positional ``dotted.key=value`` overrides, so every entry point gets the same verl-style command
line. It stays torch-free: entry points call it before importing anything heavy.
"""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec
import yaml

from async_rl.config.errors import ConfigError
from async_rl.config.fields import NOOP_PREFIX
from async_rl.config.introspect import Root, iter_schema
from async_rl.config.loader import Validate, load_tree_with_warnings
from async_rl.config.schema import Config
from async_rl.config.validate import validate_config

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=msgspec.Struct)


class CliFlags(msgspec.Struct, kw_only=True):
    """What ``parse_cli`` found besides the config itself."""

    config_paths: list[str]
    overrides: list[str]
    print_config: bool = False
    dry_run: bool = False
    warnings: list[str] = msgspec.field(default_factory=list)


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(v) for v in value]
    return value


def config_to_dict(cfg: msgspec.Struct) -> dict[str, Any]:
    """The config as plain nested dicts/lists/scalars (tuples become lists), in schema order."""
    out = _lists(msgspec.to_builtins(cfg))
    assert isinstance(out, dict)
    return out


def format_config(cfg: msgspec.Struct) -> str:
    """The (resolved) config as YAML text; loading it back gives an equal config."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False, width=120)


def _fmt_default(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def help_text(root: Root = Config) -> str:
    """Every dotted key of ``root``'s tree with its type, default and description (sections as headers)."""
    lines = [
        "usage: <entry point> [--config FILE ...] [--print-config] [--dry-run] [dotted.key=value ...]",
        "",
        "Config files are deep-merged in order, then key=value overrides are applied (values parsed as YAML:",
        "lists like trainer.logger=['console','wandb'], null, 1e-6). Keys and meanings follow verl; keys marked",
        f"'{NOOP_PREFIX}' are accepted and produce a warning when set.",
    ]
    for entry in iter_schema(root=root):
        if entry.is_section:
            lines += ["", f"[{entry.key}]  {entry.description}"]
            continue
        lines.append(f"  {entry.key}: {entry.type} = {_fmt_default(entry.default)}")
        desc = entry.description
        if entry.noop and not desc.startswith("["):
            desc = f"{NOOP_PREFIX} {desc}"
        lines += textwrap.wrap(desc, width=116, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines) + "\n"


def _split_argv(argv: Sequence[str]) -> CliFlags:
    flags = CliFlags(config_paths=[], overrides=[])
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--config", "-c"):
            if i + 1 >= len(args):
                raise ConfigError(f"{arg} needs a file path")
            flags.config_paths.append(args[i + 1])
            i += 1
        elif arg.startswith("--config="):
            flags.config_paths.append(arg.split("=", 1)[1])
        elif arg == "--print-config":
            flags.print_config = True
        elif arg == "--dry-run":
            flags.dry_run = True
        elif arg.startswith("-") and not arg.startswith("--config"):
            raise ConfigError(
                f"unknown option {arg!r}; options are --config FILE, --print-config, --dry-run, -h/--help"
            )
        else:
            flags.overrides.append(arg)
        i += 1
    return flags


def parse_cli(argv: Sequence[str] | None = None, *, exit_on_error: bool = True) -> tuple[Config, CliFlags]:
    """Parse an RL entry point's argv into a validated :class:`Config` and flags (:func:`parse_tree_cli`)."""
    return parse_tree_cli(Config, validate_config, argv, exit_on_error=exit_on_error)


def parse_tree_cli(
    root: type[T], validate: Validate[T], argv: Sequence[str] | None, *, exit_on_error: bool
) -> tuple[T, CliFlags]:
    """Parse an entry point's argv into a validated config tree of type ``root`` and flags.

    ``--help``/``-h`` prints :func:`help_text` and exits 0; ``--print-config`` prints the resolved config to stdout
    (the caller should then stop if ``flags.dry_run``). Warnings are logged and returned in ``flags.warnings``. On a
    config error, prints it to stderr and exits 2 (or raises :class:`ConfigError` when ``exit_on_error`` is false).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        sys.stdout.write(help_text(root))
        raise SystemExit(0)
    try:
        flags = _split_argv(args)
        cfg, warnings = load_tree_with_warnings(root, validate, flags.config_paths, flags.overrides)
    except ConfigError as exc:
        if not exit_on_error:
            raise
        sys.stderr.write(f"config error: {exc}\n")
        raise SystemExit(2) from None
    flags.warnings = warnings
    for warning in warnings:
        logger.warning("config: %s", warning)
    if flags.print_config:
        sys.stdout.write(format_config(cfg))
    return cfg, flags


__all__ = ["CliFlags", "config_to_dict", "format_config", "help_text", "parse_cli", "parse_tree_cli"]
