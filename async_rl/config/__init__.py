"""Typed configuration of async_rl: a msgspec struct tree with verl's dotted key names, YAML loading and validation.

Import this package without torch or vLLM (entry points parse their command line before heavy imports). Typical use::

    cfg, flags = parse_cli()                                   # --config FILE ... key=value ...
    cfg = load_config(["configs/demo_grpo.yaml"], ["actor_rollout_ref.rollout.n=8"])
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size            # typed attribute access

Every user mistake raises :class:`ConfigError` (a ``ValueError``) naming the dotted key and what is allowed.
"""

from async_rl.config.cli import CliFlags, config_to_dict, format_config, help_text, parse_cli
from async_rl.config.errors import ConfigError
from async_rl.config.introspect import KeyDoc, iter_schema
from async_rl.config.loader import (
    build_raw,
    convert,
    default_config,
    load_config,
    load_config_with_warnings,
    parse_override,
)
from async_rl.config.names import (
    ADV_ESTIMATORS,
    CRITIC_ESTIMATORS,
    GROUP_ESTIMATORS,
    KL_KINDS,
    LOGGER_BACKENDS,
    LOSS_AGG_MODES,
    POLICY_LOSS_MODES,
    needs_critic,
)
from async_rl.config.schema import Config
from async_rl.config.validate import is_loopback, learner_world_size, validate_config

__all__ = [
    "ADV_ESTIMATORS",
    "CRITIC_ESTIMATORS",
    "GROUP_ESTIMATORS",
    "KL_KINDS",
    "LOGGER_BACKENDS",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_MODES",
    "CliFlags",
    "Config",
    "ConfigError",
    "KeyDoc",
    "build_raw",
    "config_to_dict",
    "convert",
    "default_config",
    "format_config",
    "help_text",
    "is_loopback",
    "iter_schema",
    "learner_world_size",
    "load_config",
    "load_config_with_warnings",
    "needs_critic",
    "parse_cli",
    "parse_override",
    "validate_config",
]
