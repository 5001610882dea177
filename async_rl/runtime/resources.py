"""Turn a validated Config into the concrete things processes need (paths, prompt records, plane settings).

``builtin:`` names keep the demo download-free: ``builtin:tiny-arith`` is the tiny Qwen2 built in code (deterministic,
so the learner and every actor can build it independently and get identical weights) and ``builtin:arith`` is the
generated arithmetic task (train split for ``data.train_files``, eval split for ``data.val_files``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from async_rl.config import Config

logger = logging.getLogger(__name__)

BUILTIN_MODEL = "builtin:tiny-arith"
BUILTIN_DATA = "builtin:arith"
ARITH_TRAIN_SIZE = 20000
ARITH_EVAL_SIZE = 200


def run_dir(cfg: Config) -> Path:
    """Where this run writes checkpoints, metrics and plots."""
    base = cfg.async_training.checkpoint.dir or cfg.trainer.default_local_dir or "outputs"
    return Path(os.path.expanduser(base))


def resolve_model_path(spec: str, workdir: str | Path) -> str:
    """A Hugging Face model directory for ``spec``; builds the tiny model for ``builtin:tiny-arith``."""
    if spec != BUILTIN_MODEL:
        return spec
    from async_rl.models.tiny import build_tiny_model

    target = Path(workdir) / "tiny-arith"
    if not (target / "config.json").exists():
        build_tiny_model(target, seed=0)
    return str(target)


def load_raw_records(files: str | list[str] | None, prompt_key: str, split: str, seed: int) -> list[dict[str, Any]]:
    """Records ``{"prompt", "ground_truth", "extra"}`` from files or the builtin task."""
    if files is None:
        return []
    from async_rl.data import load_prompt_records, make_arith_problems

    out: list[dict[str, Any]] = []
    for f in [files] if isinstance(files, str) else files:
        if f == BUILTIN_DATA:
            size = ARITH_TRAIN_SIZE if split == "train" else ARITH_EVAL_SIZE
            out.extend({**r, "extra": {}} for r in make_arith_problems(size, seed=seed, digits=2, split=split))
        else:
            out.extend(load_prompt_records(f, prompt_key))
    return out


def tokenize_prompt(tokenizer: Any, prompt: Any) -> list[int]:
    """A plain string is encoded as is; a chat message list goes through the tokenizer's chat template."""
    if isinstance(prompt, list):
        return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True))
    return list(tokenizer(str(prompt), add_special_tokens=False)["input_ids"])


def prompt_records(cfg: Config, tokenizer: Any) -> list[Any]:
    """Tokenized training prompts as coordinator records (over-long ones filtered or rejected per config)."""
    from async_rl.transport import PromptRecord

    d = cfg.data
    raw = load_raw_records(d.train_files, d.prompt_key, "train", d.seed)
    records = []
    dropped = 0
    for i, r in enumerate(raw):
        ids = tokenize_prompt(tokenizer, r["prompt"])
        if len(ids) > d.max_prompt_length:
            if d.filter_overlong_prompts:
                dropped += 1
                continue
            if d.truncation == "error":
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens > data.max_prompt_length={d.max_prompt_length}; "
                    "set data.filter_overlong_prompts=true or data.truncation=left|right|middle"
                )
            keep = d.max_prompt_length
            if d.truncation == "left":
                ids = ids[-keep:]
            elif d.truncation == "right":
                ids = ids[:keep]
            else:
                ids = ids[: keep // 2] + ids[len(ids) - (keep - keep // 2) :]
        text = r["prompt"] if isinstance(r["prompt"], str) else tokenizer.decode(ids)
        records.append(
            PromptRecord.from_mapping(
                {"prompt_token_ids": ids, "prompt": text, "ground_truth": r["ground_truth"], "extra": r["extra"]}
            )
        )
    if dropped:
        logger.warning("dropped %d prompts longer than data.max_prompt_length=%d", dropped, d.max_prompt_length)
    if not records:
        raise ValueError(f"no training prompts loaded from data.train_files={d.train_files!r}")
    return records


def plane_settings(cfg: Config, **overrides: Any) -> Any:
    """The rollout plane's settings from ``async_training.*`` (see ``async_rl.transport.PlaneSettings``)."""
    from async_rl.transport import PlaneSettings

    a, t = cfg.async_training, cfg.async_training.transport
    kwargs: dict[str, Any] = {
        "max_staleness": a.max_staleness,
        "stale_policy": a.stale_policy,
        "groups_per_step": cfg.data.train_batch_size,
        "max_inflight_groups": t.max_inflight_groups,
        "host": t.host,
        "port": t.port,
        "max_message_bytes": t.max_message_bytes,
        "heartbeat_interval_s": t.heartbeat_interval_s,
        "peer_timeout_s": t.peer_timeout_s,
        "lease_timeout_s": t.lease_timeout_s,
        "curve_server_secret_file": t.curve_server_secret_key,
        "curve_server_public_file": t.curve_server_public_key,
        "curve_authorized_keys_dir": t.curve_client_keys_dir,
        "curve_client_secret_file": t.curve_client_secret_key,
    }
    kwargs.update(overrides)
    return PlaneSettings(**kwargs)


def sampling_params(cfg: Config, seed: int | None) -> Any:
    """Training-time sampling of every prompt group."""
    from async_rl.transport import SamplingParams

    r = cfg.actor_rollout_ref.rollout
    return SamplingParams(
        n=r.n,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=cfg.data.max_response_length,
        seed=seed,
    )
