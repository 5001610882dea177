"""Cross-field validation of a typed :class:`Config`, start-up warnings, and resolution of derived values.

Per-key types and ranges are enforced by msgspec during conversion; this module checks the rules that involve
several keys (batch divisibility, estimator vs. critic, transport security, ...). All violated rules are reported
together in one :class:`ConfigError`, one line per rule, each naming the dotted keys. Rules that verl only warns
about, and verl keys set to values that have no effect here, become warnings returned to the caller.

Decision: group-baseline estimators (grpo, rloo, rloo_vectorized, reinforce_plus_plus_baseline) with rollout.n == 1
are an ERROR, not a warning: the baseline is then the sample itself (advantage 0) or silently degenerates.
"""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path

from async_rl.config.algorithm import RolloutCorrectionConfig
from async_rl.config.common import OptimConfig
from async_rl.config.correction import check_rollout_correction
from async_rl.config.critic import CriticConfig
from async_rl.config.data_reward import RewardKwargsConfig
from async_rl.config.distillation import distillation_errors
from async_rl.config.errors import ConfigError
from async_rl.config.introspect import changed_keys
from async_rl.config.names import GROUP_ESTIMATORS, MAX_NAME_LENGTH, VLLM_MAX_LORA_RANK, needs_critic
from async_rl.config.resolve import resolve_config, reward_kwargs_aliases, reward_model_aliases
from async_rl.config.schema import Config

ARR = "actor_rollout_ref"
_REWARD_SPEC = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_KEYS_HINT = (
    "create them with `python -m async_rl.transport.keys DIR` and point the async_training.transport.curve_* keys at"
    " the files it writes"
)
_CURVE_FIELDS = (
    "curve_server_secret_key",
    "curve_server_public_key",
    "curve_client_keys_dir",
    "curve_client_secret_key",
    "curve_client_public_key",
)


def learner_world_size(cfg: Config) -> int:
    """Learner ranks: trainer.n_gpus_per_node x trainer.nnodes."""
    return cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes


def is_loopback(host: str) -> bool:
    """True for 'localhost' and loopback IP addresses (127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_ppo_batching(cfg: Config, section: str, errors: list[str]) -> None:
    """Mini-/micro-batch rules of the actor (section=actor) or critic (section=critic)."""
    actor = cfg.actor_rollout_ref.actor
    n, world, tb = cfg.actor_rollout_ref.rollout.n, learner_world_size(cfg), cfg.data.train_batch_size
    if section == "critic":
        crit = cfg.critic
        prefix, mini = "critic", crit.ppo_mini_batch_size or actor.ppo_mini_batch_size
        micro, per_gpu, max_tokens = (
            crit.ppo_micro_batch_size,
            crit.ppo_micro_batch_size_per_gpu,
            crit.ppo_max_token_len_per_gpu,
        )
        dynamic = actor.use_dynamic_bsz if crit.use_dynamic_bsz is None else crit.use_dynamic_bsz
    else:
        prefix, mini = f"{ARR}.actor", actor.ppo_mini_batch_size
        micro, per_gpu, max_tokens = (
            actor.ppo_micro_batch_size,
            actor.ppo_micro_batch_size_per_gpu,
            actor.ppo_max_token_len_per_gpu,
        )
        dynamic = actor.use_dynamic_bsz
    # A critic mini-batch left null inherits the actor's, whose divisibility is already reported under the actor.
    report_mini = section == "actor" or cfg.critic.ppo_mini_batch_size is not None
    if tb % mini and report_mini:
        errors.append(
            f"data.train_batch_size ({tb}) must be divisible by {prefix}.ppo_mini_batch_size ({mini} prompts)"
        )
    if micro is not None and per_gpu is not None:
        errors.append(
            f"{prefix}.ppo_micro_batch_size ({micro}) and {prefix}.ppo_micro_batch_size_per_gpu ({per_gpu}) are both"
            " set; set only ppo_micro_batch_size_per_gpu (the global one is deprecated)"
        )
    seqs = mini * n
    if seqs % world:
        if not report_mini:
            return
        errors.append(
            f"{prefix}.ppo_mini_batch_size ({mini}) x {ARR}.rollout.n ({n}) = {seqs} sequences must be divisible by"
            f" the learner world size trainer.n_gpus_per_node x trainer.nnodes ({world})"
        )
        return
    if dynamic:
        need = cfg.data.max_prompt_length + cfg.data.max_response_length
        if max_tokens < need:
            errors.append(
                f"{prefix}.ppo_max_token_len_per_gpu ({max_tokens}) must be >= data.max_prompt_length +"
                f" data.max_response_length ({need}) when use_dynamic_bsz is true"
            )
        return
    if micro is not None and per_gpu is None:
        if micro < world:
            errors.append(f"{prefix}.ppo_micro_batch_size ({micro}) must be >= the learner world size ({world})")
            return
        per_gpu = micro // world
    per_rank = seqs // world
    if per_gpu is not None and per_rank % per_gpu:
        errors.append(
            f"{prefix}.ppo_micro_batch_size_per_gpu ({per_gpu}) must divide the per-rank mini-batch:"
            f" ppo_mini_batch_size ({mini}) x rollout.n ({n}) / learner ranks ({world}) = {per_rank} sequences"
        )


def _check_logprob_batching(cfg: Config, errors: list[str]) -> None:
    world = learner_world_size(cfg)
    for prefix, sec in ((f"{ARR}.rollout", cfg.actor_rollout_ref.rollout), (f"{ARR}.ref", cfg.actor_rollout_ref.ref)):
        micro, per_gpu = sec.log_prob_micro_batch_size, sec.log_prob_micro_batch_size_per_gpu
        if micro is not None and per_gpu is not None:
            errors.append(
                f"{prefix}.log_prob_micro_batch_size ({micro}) and {prefix}.log_prob_micro_batch_size_per_gpu"
                f" ({per_gpu}) are both set; set only the _per_gpu one"
            )
        elif micro is not None and micro < world:
            errors.append(f"{prefix}.log_prob_micro_batch_size ({micro}) must be >= the learner world size ({world})")


# Keys the learner does not read: it uses another key's value (resolution copies it in), so one set to a different value
# is ignored and a start-up warning says so.
_FOLLOWERS = (
    ("critic.model.enable_gradient_checkpointing", f"{ARR}.model.enable_gradient_checkpointing"),
    ("critic.model.use_remove_padding", f"{ARR}.model.use_remove_padding"),
    (f"{ARR}.ref.log_prob_micro_batch_size_per_gpu", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu"),
)


def _value(cfg: Config, key: str) -> object:
    node: object = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _follower_warnings(cfg: Config, given: dict[str, object]) -> list[str]:
    """``given``: the followers' values before resolution; ``cfg`` resolved (each follower holds the value used)."""
    warnings = []
    for key, used in _FOLLOWERS:
        value = given[key]
        if key.startswith("critic.") and not needs_critic(cfg.algorithm.adv_estimator):
            continue  # critic keys are unused then, and a changed one is already an error
        if value is not None and value != _value(cfg, used):
            warnings.append(f"{key}={value} is ignored: the learner uses {used}={_value(cfg, used)} (set them equal)")
    return warnings


def _check_sampling(cfg: Config, errors: list[str]) -> None:
    ro, data = cfg.actor_rollout_ref.rollout, cfg.data
    for prefix, top_k in ((f"{ARR}.rollout", ro.top_k), (f"{ARR}.rollout.val_kwargs", ro.val_kwargs.top_k)):
        if top_k != -1 and top_k <= 0:
            errors.append(f"{prefix}.top_k must be -1 (off) or > 0, got {top_k}")
    for name, own, data_key, data_val in (
        ("prompt_length", ro.prompt_length, "max_prompt_length", data.max_prompt_length),
        ("response_length", ro.response_length, "max_response_length", data.max_response_length),
    ):
        if own is not None and own != data_val:
            errors.append(
                f"{ARR}.rollout.{name} ({own}) differs from data.{data_key} ({data_val}); set data.{data_key} only"
            )
    if ro.temperature == 0:
        errors.append(
            f"{ARR}.rollout.temperature must be > 0 for training rollouts: the learner divides the logits by it to"
            " score the sampled tokens, and greedy samples of one prompt coincide (use val_kwargs for greedy"
            " validation)"
        )
    need = data.max_prompt_length + data.max_response_length
    if ro.max_model_len is not None and ro.max_model_len < need:
        errors.append(
            f"{ARR}.rollout.max_model_len ({ro.max_model_len}) must be >= data.max_prompt_length +"
            f" data.max_response_length ({need})"
        )


def _check_validation(cfg: Config, errors: list[str]) -> None:
    data, vk = cfg.data, cfg.actor_rollout_ref.rollout.val_kwargs
    if data.val_max_samples == 0:
        errors.append("data.val_max_samples must be -1 (every validation prompt) or >= 1, got 0")
    group_bytes = vk.n * data.max_response_length * 8
    if data.val_files is not None and vk.do_sample and group_bytes > cfg.async_training.transport.max_message_bytes:
        errors.append(
            f"async_training.transport.max_message_bytes ({cfg.async_training.transport.max_message_bytes}) is below"
            f" one validation group's payload ({ARR}.rollout.val_kwargs.n={vk.n} x {data.max_response_length} tokens"
            " x 8 bytes)"
        )


def _validation_warnings(cfg: Config) -> list[str]:
    data, tr, vk = cfg.data, cfg.trainer, cfg.actor_rollout_ref.rollout.val_kwargs
    warnings = []
    if data.val_files is None and tr.test_freq > 0:
        warnings.append(f"trainer.test_freq={tr.test_freq} is ignored: data.val_files is null, so nothing is validated")
    if not vk.do_sample:
        default = type(vk)()
        ignored = [f"{ARR}.rollout.val_kwargs.{k}" for k in ("n", "temperature", "top_p", "top_k")
                   if getattr(vk, k) != getattr(default, k)]  # fmt: skip
        if ignored:
            warnings.append(
                f"{', '.join(ignored)} are ignored with {ARR}.rollout.val_kwargs.do_sample=false: validation decodes"
                " greedily, one sample per prompt (set do_sample=true to sample)"
            )
    return warnings


def optim_errors(optim: OptimConfig, prefix: str) -> list[str]:
    """What is wrong with an ``optim`` section at ``prefix`` (any config tree's)."""
    errors = []
    if optim.warmup_style is not None and optim.warmup_style != optim.lr_scheduler_type:
        if optim.lr_scheduler_type != "constant":
            errors.append(
                f"{prefix}.warmup_style ({optim.warmup_style!r}) conflicts with {prefix}.lr_scheduler_type"
                f" ({optim.lr_scheduler_type!r}); set only lr_scheduler_type"
            )
    if any(b >= 1 for b in optim.betas):
        errors.append(f"{prefix}.betas must each be in [0, 1), got {list(optim.betas)}")
    return errors


def _check_actor(cfg: Config, errors: list[str]) -> None:
    actor = cfg.actor_rollout_ref.actor
    if actor.clip_ratio_c <= 1:
        errors.append(f"{ARR}.actor.clip_ratio_c must be > 1 (dual-clip bound), got {actor.clip_ratio_c}")
    low = actor.clip_ratio if actor.clip_ratio_low is None else actor.clip_ratio_low
    if low >= 1:
        key = "clip_ratio_low" if actor.clip_ratio_low is not None else "clip_ratio"
        errors.append(f"{ARR}.actor.{key} must be < 1 (the ratio lower bound is 1 - it), got {low}")
    for prefix, optim in ((f"{ARR}.actor.optim", actor.optim), ("critic.optim", cfg.critic.optim)):
        errors.extend(optim_errors(optim, prefix))
    for key, dynamic in (
        (f"{ARR}.actor.use_dynamic_bsz", actor.use_dynamic_bsz),
        (f"{ARR}.rollout.log_prob_use_dynamic_bsz", cfg.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz),
        (f"{ARR}.ref.log_prob_use_dynamic_bsz", cfg.actor_rollout_ref.ref.log_prob_use_dynamic_bsz),
        ("critic.use_dynamic_bsz", cfg.critic.use_dynamic_bsz if needs_critic(cfg.algorithm.adv_estimator) else None),
    ):
        if dynamic:
            errors.append(f"{key}=true is not supported by the learner yet (it batches by sequence count)")


def _check_lora(cfg: Config, errors: list[str]) -> None:
    model = cfg.actor_rollout_ref.model
    if model.lora_rank == 0:
        return
    if model.lora_rank > VLLM_MAX_LORA_RANK:
        errors.append(
            f"{ARR}.model.lora_rank ({model.lora_rank}) must be <= {VLLM_MAX_LORA_RANK} (vLLM's largest rank)"
        )
    targets = model.target_modules
    if isinstance(targets, str) and targets != "all-linear":
        errors.append(f"{ARR}.model.target_modules must be 'all-linear' or a list of module names, got {targets!r}")
    if isinstance(targets, list) and not targets:
        errors.append(f"{ARR}.model.target_modules must not be empty when lora_rank > 0")


def _check_algorithm(cfg: Config, errors: list[str]) -> None:
    alg, n = cfg.algorithm, cfg.actor_rollout_ref.rollout.n
    est = alg.adv_estimator
    if est in GROUP_ESTIMATORS and n < 2:
        errors.append(
            f"algorithm.adv_estimator={est!r} computes a baseline from the other samples of the same prompt, so it"
            f" needs {ARR}.rollout.n >= 2 (got {n})"
        )
    if needs_critic(est):
        path, actor_path = cfg.critic.model.path, cfg.actor_rollout_ref.model.path
        if not path:
            errors.append(f"algorithm.adv_estimator={est!r} needs a value model: set critic.model.path")
        elif (path.startswith("builtin:") or actor_path.startswith("builtin:")) and path != actor_path:
            errors.append(
                f"critic.model.path ({path!r}) and {ARR}.model.path ({actor_path!r}) must name the same builtin model"
                " when either is builtin (they share the tokenizer); set critic.model.path"
            )
    else:
        ignored = changed_keys(cfg.critic, CriticConfig(), "critic.")
        if cfg.trainer.critic_warmup:
            ignored.append("trainer.critic_warmup")
        if ignored:
            errors.append(
                f"algorithm.adv_estimator={est!r} uses no critic, but these critic settings were changed and would be"
                f" silently ignored: {', '.join(ignored)} (remove them or use adv_estimator='gae')"
            )
    check_rollout_correction(alg.rollout_correction, RolloutCorrectionConfig(), errors)


_FG = "algorithm.filter_groups"


def _check_filter_groups(cfg: Config, errors: list[str]) -> None:
    fg, n = cfg.algorithm.filter_groups, cfg.actor_rollout_ref.rollout.n
    if fg.metric is not None and not 0 < len(fg.metric) <= MAX_NAME_LENGTH:
        errors.append(
            f"{_FG}.metric must be 'reward' or a reward component name of 1 to {MAX_NAME_LENGTH} characters,"
            f" got {fg.metric!r}"
        )
    if not fg.enable:
        return
    if n < 2:
        errors.append(
            f"{_FG}.enable=true needs {ARR}.rollout.n >= 2 (got {n}): a group of one completion has no variance,"
            " so there is nothing to filter on"
        )
    if fg.metric is None:
        errors.append(f"{_FG}.enable=true needs {_FG}.metric: 'reward' (the scalar reward) or a reward component name")


def _filter_groups_warnings(cfg: Config) -> list[str]:
    fg = cfg.algorithm.filter_groups
    default = type(fg)()
    ignored = [f"{_FG}.{k}" for k in ("metric", "max_num_gen_batches") if getattr(fg, k) != getattr(default, k)]
    if not fg.enable and ignored:
        return [f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored with {_FG}.enable=false"]
    shaping = cfg.reward.reward_kwargs.overlong_buffer_cfg.enable
    if fg.enable and fg.metric not in (None, "reward") and not (fg.metric == "acc" and shaping):
        return [
            f"{_FG}.metric={fg.metric!r} must be a component every reward of the run carries (a key of the dict the"
            " reward function returns; 'acc', the unshaped score, is added by the overlong shaping"
            " reward.reward_kwargs.overlong_buffer_cfg.enable); a group without it is refused as invalid"
        ]
    return []


def resume_error(mode: str, from_path: str | None) -> str | None:
    """The error of ``trainer.resume_mode`` / ``trainer.resume_from_path`` (both trees), or None."""
    if mode == "resume_path" and not from_path:
        return "trainer.resume_mode='resume_path' needs trainer.resume_from_path"
    return None


def model_path_error(key: str, path: str | None) -> str | None:
    """The error for a ``builtin:`` model name at config ``key`` that names no builtin model, else None."""
    from async_rl.models.catalog import PRETRAINED

    known = ["builtin:tiny-arith", *(f"builtin:{name}" for name in sorted(PRETRAINED))]
    if path and path.startswith("builtin:") and path not in known:
        return f"{key}={path!r} names no builtin model; builtin models: {', '.join(known)}"
    return None


def _check_model_paths(cfg: Config, errors: list[str]) -> None:
    for key, path in (
        (f"{ARR}.model.path", cfg.actor_rollout_ref.model.path),
        ("critic.model.path", cfg.critic.model.path),
    ):
        error = model_path_error(key, path)
        if error is not None:
            errors.append(error)


def _check_reward_and_trainer(cfg: Config, errors: list[str]) -> None:
    if not _REWARD_SPEC.match(cfg.reward.function):
        errors.append(f"reward.function must look like 'package.module:function', got {cfg.reward.function!r}")
    default_fn = type(cfg.reward)().function
    if cfg.custom_reward_function.path and cfg.reward.function != default_fn:
        errors.append("custom_reward_function.path and reward.function are both set; set only one of them")
    tr = cfg.trainer
    if tr.total_epochs is None and tr.total_training_steps is None:
        errors.append("trainer.total_epochs and trainer.total_training_steps are both null; set one to bound the run")
    resume = resume_error(tr.resume_mode, tr.resume_from_path)
    if resume is not None:
        errors.append(resume)
    if tr.device == "cpu" and cfg.async_training.weight_sync.backend == "nccl":
        errors.append("async_training.weight_sync.backend='nccl' needs CUDA, but trainer.device='cpu'")


def _check_multi_turn(cfg: Config, errors: list[str]) -> None:
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    key = f"{ARR}.rollout.multi_turn"
    if not mt.enable:
        return
    if mt.environment is None:
        errors.append(
            f"{key}.enable=true needs {key}.environment ('module:Class', e.g. async_rl.envs.guessing:GuessingEnv)"
        )
    elif not _REWARD_SPEC.match(mt.environment):
        errors.append(f"{key}.environment must look like 'package.module:Class', got {mt.environment!r}")
    if cfg.reward.reward_kwargs.overlong_buffer_cfg.enable:
        errors.append(
            f"{key}.enable=true: the environment gives the reward; reward.reward_kwargs.overlong_buffer_cfg"
            " (overlong shaping) does not apply to episodes, turn it off"
        )


def _check_reward_model(cfg: Config, errors: list[str]) -> None:
    """verl's older spellings agree with ``reward.reward_model``; an enabled model has a usable directory."""
    served, default = cfg.reward.reward_model, type(cfg.reward.reward_model)()
    effective = {"enable": served.enable, "model_path": served.model_path}
    for key, alias, value in reward_model_aliases(cfg):
        name = key.rsplit(".", 1)[-1]
        own = getattr(served, name)
        if own != getattr(default, name) and own != value:
            errors.append(f"{key}={own!r} and its older spelling {alias}={value!r} differ; set only {key}")
        effective[name] = value
    if not effective["enable"]:
        return
    key = "reward.reward_model"
    path = effective["model_path"]
    if not path:
        errors.append(f"{key}.enable=true needs {key}.model_path (the directory tools/train_reward_model.py exported)")
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        errors.append(f"{key}.enable=true: multi-turn episodes are scored by their environment; turn one of them off")
    if not (math.isfinite(served.weight) and math.isfinite(served.rule_weight)):
        errors.append(f"{key}.weight and rule_weight must be finite, got {served.weight} and {served.rule_weight}")


def _check_reward_kwargs(cfg: Config, errors: list[str]) -> None:
    """Older spellings of reward.reward_kwargs must agree with it and each other; overlong shaping needs a valid zone.

    A ``reward.reward_kwargs`` key counts as set when it differs from its default (so an alias wins over a key left at,
    or explicitly set to, its default)."""
    kwargs, default = cfg.reward.reward_kwargs, RewardKwargsConfig()
    effective: dict[str, object] = {}
    spellings: dict[str, list[tuple[str, object]]] = {}
    for key, alias, given_value in reward_kwargs_aliases(cfg):
        spellings.setdefault(key, []).append((alias, given_value))
    for key, aliases in spellings.items():
        name = key.rsplit(".", 1)[-1]
        own, own_default = (
            (kwargs.max_resp_len, default.max_resp_len)
            if name == "max_resp_len"
            else (getattr(kwargs.overlong_buffer_cfg, name), getattr(default.overlong_buffer_cfg, name))
        )
        given = ([(key, own)] if own != own_default else []) + aliases
        if len({repr(v) for _, v in given}) > 1:
            listed = ", ".join(f"{k}={v!r}" for k, v in given)
            errors.append(f"{key} is set by several spellings to different values: {listed}; set only {key}")
        effective[key] = aliases[0][1]
    prefix = "reward.reward_kwargs.overlong_buffer_cfg"
    buf = kwargs.overlong_buffer_cfg

    def effective_value(name: str) -> object:
        return effective.get(f"{prefix}.{name}", getattr(buf, name))

    if not effective_value("enable"):
        return
    buffer_len = effective_value("len")
    assert isinstance(buffer_len, int)
    if buffer_len <= 0:
        errors.append(
            f"{prefix}.len must be > 0 when {prefix}.enable is true (got {buffer_len}); set it to the penalty zone's"
            " length in tokens, or set enable=false"
        )
        return
    max_len = effective.get("reward.reward_kwargs.max_resp_len", kwargs.max_resp_len)
    shown = f"({max_len})"
    if max_len is None:
        max_len = cfg.data.max_response_length
        shown = f"(null = data.max_response_length = {max_len})"
    assert isinstance(max_len, int)
    if max_len < buffer_len:
        errors.append(
            f"reward.reward_kwargs.max_resp_len {shown} must be >= {prefix}.len ({buffer_len}) when {prefix}.enable"
            " is true"
        )


def _check_async(cfg: Config, errors: list[str]) -> None:
    at, tr = cfg.async_training, cfg.trainer
    tp = at.transport
    if at.sync_every_n_steps > at.max_staleness + 1:
        errors.append(
            f"async_training.sync_every_n_steps ({at.sync_every_n_steps}) must be <= async_training.max_staleness + 1"
            f" ({at.max_staleness + 1}): between two broadcasts the learner runs up to sync_every_n_steps - 1"
            " versions ahead of every actor's weights, and past max_staleness no group could be admitted"
        )
    missing = [f for f in _CURVE_FIELDS if not getattr(tp, f)]
    if not is_loopback(tp.host) and missing:
        errors.append(
            f"async_training.transport.host={tp.host!r} is not loopback, so the rollout plane must be encrypted and"
            f" authenticated with CURVE, but these keys are unset: {', '.join(missing)}; {_KEYS_HINT}"
        )
    elif 0 < len(missing) < len(_CURVE_FIELDS):
        errors.append(
            f"async_training.transport: some CURVE keys are set but these are missing: {', '.join(missing)}"
            f" (set all five or none); {_KEYS_HINT}"
        )
    if tp.peer_timeout_s <= tp.heartbeat_interval_s:
        errors.append(
            f"async_training.transport.peer_timeout_s ({tp.peer_timeout_s}) must be > heartbeat_interval_s"
            f" ({tp.heartbeat_interval_s})"
        )
    tb = cfg.data.train_batch_size
    if tp.max_inflight_groups is not None and tp.max_inflight_groups < tb:
        errors.append(
            f"async_training.transport.max_inflight_groups ({tp.max_inflight_groups}) must be >= the groups of one"
            f" step, data.train_batch_size ({tb}), or no step could ever fill"
        )
    n, resp = cfg.actor_rollout_ref.rollout.n, cfg.data.max_response_length
    group_bytes = n * resp * 8  # lower bound: int32 token id + float32 log-prob per generated token
    if group_bytes > tp.max_message_bytes:
        errors.append(
            f"async_training.transport.max_message_bytes ({tp.max_message_bytes}) is below one group's payload"
            f" ({n} x {resp} tokens x 8 bytes = {group_bytes})"
        )
    ck = at.checkpoint
    pairs = (
        ("async_training.checkpoint.dir", ck.dir, "trainer.default_local_dir", tr.default_local_dir),
        ("async_training.checkpoint.save_every_n_steps", ck.save_every_n_steps, "trainer.save_freq",
         tr.save_freq if tr.save_freq > 0 else None),
        ("async_training.checkpoint.keep_last", ck.keep_last, "trainer.max_actor_ckpt_to_keep",
         tr.max_actor_ckpt_to_keep),
    )  # fmt: skip
    for ours, our_val, verls, verl_val in pairs:
        if our_val is not None and verl_val is not None and our_val != verl_val:
            errors.append(f"{ours} ({our_val!r}) conflicts with its verl alias {verls} ({verl_val!r}); set only one")


def collect_warnings(cfg: Config) -> list[str]:
    """Start-up warnings: verl no-op keys that were set, and combinations verl also only warns about."""
    warnings: list[str] = []
    noop = changed_keys(cfg, Config(), "", only_noop=True)
    if noop:
        warnings.append(f"these keys are accepted but have no effect in async_rl: {', '.join(noop)}")
    actor, ro, alg = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.algorithm
    model = cfg.actor_rollout_ref.model
    if model.gradient_checkpointing_interval != 1 and not model.enable_gradient_checkpointing:
        warnings.append(
            f"{ARR}.model.gradient_checkpointing_interval={model.gradient_checkpointing_interval} has no effect:"
            f" {ARR}.model.enable_gradient_checkpointing is false"
        )
    if alg.use_kl_in_reward and actor.use_kl_loss:
        warnings.append(
            "algorithm.use_kl_in_reward and actor_rollout_ref.actor.use_kl_loss are both true:"
            " the KL is penalized twice"
        )
    rc, at = alg.rollout_correction, cfg.async_training
    weighted = rc.enable is not False and (rc.rollout_is is not None or rc.enable is True or rc.is_level is not None)
    if not weighted and not rc.bypass_mode and at.max_staleness > 0:
        off = "enable=false" if rc.enable is False else "rollout_is=null"
        warnings.append(
            f"algorithm.rollout_correction.{off} with async_training.max_staleness={at.max_staleness}:"
            " off-policy samples are trained without importance correction"
        )
    if rc.is_mode == "truncate" and rc.is_threshold_lower is not None:
        warnings.append("algorithm.rollout_correction.is_threshold_lower is only used by is_mode='mask'; ignored")
    if rc.bypass_mode and actor.policy_loss.loss_mode != "vanilla":
        warnings.append(
            f"algorithm.rollout_correction.bypass_mode=true replaces {ARR}.actor.policy_loss.loss_mode"
            f"={actor.policy_loss.loss_mode!r} by PPO clip or REINFORCE (loss_type), as verl does"
        )
    if cfg.rejection_sampling.enable and (
        cfg.trainer.total_training_steps is not None or cfg.trainer.total_epochs != 1
    ):
        warnings.append(
            "trainer.total_training_steps and trainer.total_epochs are ignored by a rejection-sampling job: it"
            " generates one pass over data.train_files"
        )
    shaped = ro.temperature != 1.0 or ro.top_p < 1.0 or ro.top_k != -1
    if cfg.distillation.enabled and shaped:
        warnings.append(
            "distillation.enabled=true with temperature/top-p/top-k sampling: the teacher scores at temperature 1 over"
            " the whole vocabulary, the student's log-probs are of the shaped distribution, so even a student equal to"
            " the teacher gets a signal (sample with temperature 1.0, top_p 1.0, top_k -1)"
        )
    if at.actor.logprobs_mode == "raw" and (weighted or rc.bypass_mode) and shaped:
        warnings.append(
            "async_training.actor.logprobs_mode='raw' with temperature/top-p/top-k sampling: behaviour log-probs do not"
            " match the sampled distribution, so importance ratios are biased (use 'processed')"
        )
    warnings.extend(_validation_warnings(cfg))
    warnings.extend(_filter_groups_warnings(cfg))
    return warnings


def _check_rejection_sampling(cfg: Config, errors: list[str]) -> None:
    rs = cfg.rejection_sampling
    if not rs.enable:
        return
    if learner_world_size(cfg) != 1:
        errors.append(
            "rejection_sampling.enable=true runs one learner process (it trains nothing): set"
            f" trainer.n_gpus_per_node=1 and trainer.nnodes=1 (got {learner_world_size(cfg)} processes)"
        )
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        errors.append("rejection_sampling.enable=true writes single exchanges: multi_turn.enable=true is not supported")
    if rs.output is not None and not rs.output.endswith((".jsonl", ".parquet")):
        errors.append(f"rejection_sampling.output must be a .jsonl or .parquet file, got {rs.output!r}")
    if cfg.trainer.resume_mode == "resume_path":
        errors.append(
            "rejection_sampling.enable=true resumes from its own run directory only: set trainer.resume_mode=auto"
            " (or disable)"
        )


def _check_distillation(cfg: Config, errors: list[str]) -> None:
    dist = cfg.distillation
    if not dist.enabled:
        return
    errors.extend(
        distillation_errors(dist, rollout_gpu_memory_utilization=cfg.actor_rollout_ref.rollout.gpu_memory_utilization)
    )
    error = model_path_error("distillation.teacher_model.model_path", dist.teacher_model.model_path)
    if error is not None:
        errors.append(error)
    if cfg.rejection_sampling.enable:
        errors.append("distillation.enabled=true trains, rejection_sampling.enable=true trains nothing: set one")


def validate_config(cfg: Config) -> list[str]:
    """Check every cross-field rule (one ConfigError listing all violations), then fill in derived values in place
    (null "inherit"/"derived" keys, deprecated aliases; idempotent) and return the start-up warnings."""
    errors: list[str] = []
    _check_ppo_batching(cfg, "actor", errors)
    if needs_critic(cfg.algorithm.adv_estimator):
        _check_ppo_batching(cfg, "critic", errors)
    _check_logprob_batching(cfg, errors)
    _check_sampling(cfg, errors)
    _check_validation(cfg, errors)
    _check_actor(cfg, errors)
    _check_lora(cfg, errors)
    _check_algorithm(cfg, errors)
    _check_filter_groups(cfg, errors)
    _check_model_paths(cfg, errors)
    _check_reward_and_trainer(cfg, errors)
    _check_reward_kwargs(cfg, errors)
    _check_reward_model(cfg, errors)
    _check_multi_turn(cfg, errors)
    _check_async(cfg, errors)
    _check_rejection_sampling(cfg, errors)
    _check_distillation(cfg, errors)
    if len(errors) == 1:
        raise ConfigError(errors[0])
    if errors:
        raise ConfigError(f"{len(errors)} config errors:\n" + "\n".join(f"  - {e}" for e in errors))
    warnings = collect_warnings(cfg)
    followers = {key: _value(cfg, key) for key, _ in _FOLLOWERS}
    resolve_config(cfg)
    warnings.extend(_follower_warnings(cfg, followers))
    return warnings


__all__ = [
    "check_reward_model_dir",
    "collect_warnings",
    "is_loopback",
    "learner_world_size",
    "model_path_error",
    "optim_errors",
    "resume_error",
    "validate_config",
]


def check_reward_model_dir(cfg: Config) -> None:
    """Raise ValueError naming the key when an enabled reward model's directory holds no model. Checked when a job
    starts (the launcher, the reward server, an inline actor), not when a config loads: a pipeline's config names
    the directory an earlier stage will export."""
    rm = cfg.reward.reward_model
    if rm.enable and rm.model_path and not (Path(rm.model_path).expanduser() / "config.json").is_file():
        raise ValueError(
            f"reward.reward_model.model_path={rm.model_path!r} is not a model directory (no config.json in it):"
            " train and export the reward model first (tools/train_reward_model.py)"
        )
