"""No config key may lie: each one is read by the code a run executes, or is declared a no-op and warned about.

"Read" is decided by a static scan (``_config_key_usage.py``): an expression in a module that a training run imports
(outside the config package) must evaluate to the key's exact config path, e.g. ``cfg.trainer.seed`` or ``r.n`` with
``r = cfg.actor_rollout_ref.rollout``; keys that validation folds into another key (aliases, deprecated spellings) are
read when that key is. The few keys no scan can see are listed below, each with what makes it honest, and that is
checked too. A no-op key (``noop(...)`` in the schema) must produce a start-up warning that names it when set.
The reward-model tree (``async_rl.entrypoints.train_reward_model``'s) is scanned the same way, over its own run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from _config_key_usage import consumed_keys, module_file, scan_repository, scan_sources

from async_rl.config import Config, ConfigError, iter_schema, load_config, load_config_with_warnings
from async_rl.config.introspect import Root, type_at, unwrap
from async_rl.config.pipeline import PipelineConfig
from async_rl.config.reward_model_train import RewardModelTrainConfig
from async_rl.config.sft import SFTConfig

ARR = "actor_rollout_ref"
_OVERLONG = "reward.reward_kwargs.overlong_buffer_cfg"
_RM_DIR = str(Path(__file__).resolve().parent / "fixtures" / "reward_model")  # holds a config.json

# verl's older spellings of reward.reward_kwargs: resolve.py folds them in through getattr over OVERLONG_KEYS, which no
# static scan follows. Each must land on its key (checked below), and that key must be read.
ALIASES: dict[str, tuple[str, Any, list[str]]] = {  # alias: (the key it sets, a value to try, what that value needs)
    **{
        f"{prefix}.{name}": (f"{_OVERLONG}.{name}", value, [f"{prefix}.len=4"] if name == "enable" else [])
        for prefix in ("reward_model.reward_kwargs.overlong_buffer_cfg", "reward_model.overlong_buffer")
        for name, value in (("enable", True), ("len", 4), ("penalty_factor", 0.5), ("log", True))
    },
    "reward_model.reward_kwargs.max_resp_len": ("reward.reward_kwargs.max_resp_len", 6, []),
    # verl's older reward-model switch and path (resolve.py folds them in)
    "reward_model.enable": ("reward.reward_model.enable", True, [f"reward.reward_model.model_path={_RM_DIR}"]),
    "reward_model.model.path": ("reward.reward_model.model_path", _RM_DIR, []),
}
# verl's copies of the data.* lengths: validation refuses any value but the one the code reads (checked below).
MUST_EQUAL = {  # key: (the key it must equal, a different value to try)
    f"{ARR}.rollout.prompt_length": ("data.max_prompt_length", 17),
    f"{ARR}.rollout.response_length": ("data.max_response_length", 9),
}
# Keys the code does not read because it uses another key's value: validation copies that value in, and a different
# one set by the user is ignored with a start-up warning naming both (checked below).
FOLLOWERS = {  # key: (the key whose value is used, a different value to try)
    "critic.model.enable_gradient_checkpointing": (f"{ARR}.model.enable_gradient_checkpointing", False),
    "critic.model.use_remove_padding": (f"{ARR}.model.use_remove_padding", True),
    f"{ARR}.ref.log_prob_micro_batch_size_per_gpu": (f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu", 3),
}
# Keys whose every accepted value means the same here (checked: these are all the values the type accepts).
SAME_MEANING = {
    f"{ARR}.actor.strategy": ("fsdp", "fsdp2"),  # both are FSDP2 (the docs say so)
    f"{ARR}.ref.strategy": ("fsdp", "fsdp2"),
    "critic.strategy": ("fsdp", "fsdp2"),
}


def _leaf_types(root: Root = Config) -> dict[str, tuple[mi.Type, Any]]:
    """Every leaf key's schema type (metadata stripped) and default."""
    out: dict[str, tuple[mi.Type, Any]] = {}
    for d in iter_schema(root=root):
        if not d.is_section:
            tp = type_at(list(d.key.split(".")), root)
            assert tp is not None, d.key
            out[d.key] = (unwrap(tp)[0], d.default)
    return out


def _single_valued(tp: mi.Type) -> bool:
    """A key whose type accepts one value only cannot be set to anything the code would ignore."""
    return isinstance(tp, mi.LiteralType) and len(tp.values) == 1


@pytest.fixture(scope="module")
def consumed() -> set[str]:
    return scan_repository()


def test_every_key_is_read_or_declared_a_no_op(consumed: set[str]) -> None:
    noop = {d.key for d in iter_schema() if d.noop and not d.is_section}
    explained = set(ALIASES) | set(MUST_EQUAL) | set(FOLLOWERS) | set(SAME_MEANING)
    lying = [
        key
        for key, (tp, _) in _leaf_types().items()
        if key not in noop and key not in consumed and key not in explained and not _single_valued(tp)
    ]
    assert not lying, (
        "these config keys are documented as doing something, but no code a run imports reads them: "
        f"{', '.join(lying)}. Read them (typed attribute access, e.g. cfg.section.key), or declare them "
        "noop(...) with a doc saying what happens instead."
    )
    stale = sorted(k for k in explained if k in consumed or k in noop)
    assert not stale, f"listed as explained but now read or declared no-op (remove them from the lists): {stale}"


def test_every_reward_model_key_is_read() -> None:
    """The reward-model tree declares no no-op keys: each one is read by the code its entry point runs."""
    consumed = scan_repository(RewardModelTrainConfig)
    assert not [d.key for d in iter_schema(root=RewardModelTrainConfig) if d.noop]
    types = _leaf_types(RewardModelTrainConfig)
    assert "trainer.save_freq" in types and "optim.lr" in consumed  # read through learner/optim.py's OptimConfig
    lying = [key for key, (tp, _) in types.items() if key not in consumed and not _single_valued(tp)]
    assert not lying, f"reward-model keys documented as doing something that its run never reads: {lying}"


def test_every_sft_key_is_read() -> None:
    """The SFT tree declares no no-op keys: each one is read by the code its entry point runs."""
    consumed = scan_repository(SFTConfig)
    assert not [d.key for d in iter_schema(root=SFTConfig) if d.noop]
    types = _leaf_types(SFTConfig)
    assert "data.multiturn.messages_key" in types and "model.lora_rank" in consumed
    lying = [key for key, (tp, _) in types.items() if key not in consumed and not _single_valued(tp)]
    assert not lying, f"SFT keys documented as doing something that its run never reads: {lying}"


def test_every_pipeline_key_is_read() -> None:
    consumed = scan_repository(PipelineConfig)
    types = _leaf_types(PipelineConfig)
    assert "stages" in types and "run_dir" in consumed
    lying = [key for key, (tp, _) in types.items() if key not in consumed and not _single_valued(tp)]
    assert not lying, f"pipeline keys documented as doing something that launchers/pipeline.py never reads: {lying}"


def test_aliases_land_on_the_key_they_spell(consumed: set[str]) -> None:
    for alias, (target, value, needs) in ALIASES.items():
        cfg = load_config(None, [f"{alias}={json.dumps(value)}", *needs])
        assert _get(cfg, target) == value, f"{alias}={value!r} did not set {target}"
        assert target in consumed, f"{alias} spells {target}, which nothing reads"


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_followers_warn_when_their_value_is_not_the_one_used(consumed: set[str]) -> None:
    for key, (used, value) in FOLLOWERS.items():
        assert used in consumed
        cfg, warnings = load_config_with_warnings(None, [f"{key}={value}"])
        assert [w for w in warnings if w.startswith(f"{key}={value} is ignored") and used in w], key
        assert _get(cfg, key) == _get(cfg, used) != value  # the resolved config shows what is used
        same, quiet = load_config_with_warnings(None, [f"{key}={value}", f"{used}={value}"])
        assert _get(same, key) == value and not [w for w in quiet if key in w]


def test_copies_of_other_keys_refuse_any_other_value(consumed: set[str]) -> None:
    for key, (other, value) in MUST_EQUAL.items():
        assert other in consumed
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, [f"{key}={value}"])
    types = _leaf_types()
    for key, values in SAME_MEANING.items():
        tp = types[key][0]
        assert isinstance(tp, mi.LiteralType) and set(tp.values) == set(values), key


def _other_values(tp: mi.Type, default: Any) -> list[Any]:
    """Values unlike ``default`` that a key of type ``tp`` accepts (tried in order)."""
    tp = unwrap(tp)[0]
    if isinstance(tp, mi.UnionType):
        return [v for member in tp.types for v in _other_values(member, default)]
    if isinstance(tp, mi.BoolType):
        return [not default] if isinstance(default, bool) else [True, False]
    if isinstance(tp, mi.IntType):
        return [default + 1 if isinstance(default, int) else max(1, tp.ge or 1)]
    if isinstance(tp, mi.FloatType):
        return [default + 0.5 if isinstance(default, float) else 0.5]
    if isinstance(tp, mi.LiteralType):
        return [v for v in tp.values if v != default]
    if isinstance(tp, mi.StrType):
        return ["changed"]
    if isinstance(tp, mi.ListType):
        return [[1], ["changed"]]
    if isinstance(tp, mi.DictType):
        return [{"changed": 1}]
    return []


def test_every_no_op_key_warns_naming_it_when_set() -> None:
    types = _leaf_types()
    silent, unsettable = [], []
    for key in (d.key for d in iter_schema() if d.noop and not d.is_section):
        tp, default = types[key]
        for value in _other_values(tp, default):
            try:
                _, warnings = load_config_with_warnings(None, [f"{key}={json.dumps(value)}"])
            except (ConfigError, msgspec.ValidationError):
                continue
            if not any("no effect" in w and key in w.replace(",", " ").split() for w in warnings):
                silent.append(key)
            break
        else:
            unsettable.append(key)
    assert not silent, f"no-op keys set without a start-up warning naming them: {silent}"
    assert not unsettable, (
        f"found no accepted non-default value for these no-op keys (extend _other_values): {unsettable}"
    )


# ---------------------------------------------------------------------------------------------------------------------
# The scan itself: it must see a reader go away.

_HEAD = "from async_rl.config import Config\nfrom async_rl.config.common import OptimConfig\n"


def _reads(*sources: str, resolvers: tuple[str, ...] = ()) -> set[str]:
    runtime = scan_sources(_HEAD + s for s in sources)
    return consumed_keys(runtime, scan_sources((_HEAD + s for s in resolvers), track_flows=True))


def test_the_scan_needs_the_exact_config_path() -> None:
    assert "trainer.seed" in _reads("def f(cfg: Config):\n    return cfg.trainer.seed\n")
    assert "trainer.seed" not in _reads("def f(cfg: Config):\n    return cfg.trainer\n")
    local = "def f(cfg: Config):\n    r = cfg.actor_rollout_ref.rollout\n    return r.n\n"
    assert f"{ARR}.rollout.n" in _reads(local)
    tuple_bound = (
        "def f(cfg: Config):\n    a, t = cfg.async_training, cfg.async_training.transport\n    return t.port\n"
    )
    assert "async_training.transport.port" in _reads(tuple_bound)
    in_class = "class A:\n    def __init__(self, cfg: Config):\n        self.cfg = cfg\n    def g(self):\n"
    assert "trainer.seed" in _reads(in_class + "        return self.cfg.trainer.seed\n")
    # a matching leaf name on something that is not the config is not a read
    assert not _reads("def f(settings):\n    return settings.critic.ppo_epochs, settings.seed\n")


def test_a_shared_section_type_counts_only_where_that_section_is_reached() -> None:
    reader = "def lr(optim: OptimConfig):\n    return optim.lr\n"
    assert not _reads(reader)
    got = _reads(reader, "def f(cfg: Config):\n    return lr(cfg.critic.optim)\n")
    assert "critic.optim.lr" in got and f"{ARR}.actor.optim.lr" not in got


def test_a_key_folded_into_another_counts_only_if_that_one_is_read() -> None:
    resolver = "def r(cfg: Config):\n    ck = cfg.async_training.checkpoint\n"
    resolver += "    ck.dir = ck.dir or cfg.trainer.default_local_dir\n"
    reader = "def f(cfg: Config):\n    return cfg.async_training.checkpoint.dir\n"
    assert "trainer.default_local_dir" in _reads(reader, resolvers=(resolver,))
    assert "trainer.default_local_dir" not in _reads("x = 1\n", resolvers=(resolver,))
    guarded = "def r(cfg: Config):\n    rc = cfg.algorithm.rollout_correction\n    if rc.enable is False:\n"
    guarded += "        rc.rollout_is = None\n"
    reader = "def f(cfg: Config):\n    return cfg.algorithm.rollout_correction.rollout_is\n"
    assert "algorithm.rollout_correction.enable" in _reads(reader, resolvers=(guarded,))


def test_removing_a_real_reader_is_seen(consumed: set[str]) -> None:
    """Drop the one line that reads transport.max_actors from the real module: the key is no longer read."""
    key = "async_training.transport.max_actors"
    assert key in consumed
    path = module_file("async_rl.transport.coordinator")
    assert path is not None
    text = path.read_text()
    line = "self.transport.max_actors,"
    assert text.count(line) == 1
    others = [module_file(m) for m in ("async_rl.transport.sockets", "async_rl.transport.client")]
    without = scan_sources([text.replace(line, "0,"), *(p.read_text() for p in others if p)])
    assert key in consumed_keys(scan_sources([text]))
    assert key not in consumed_keys(without)
