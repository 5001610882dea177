"""What a run keeps on disk besides its metrics: checkpoints (with the coordinator's ledger) and the audit log.

``checkpoints/`` holds the model, optimizer, scheduler and RNG states plus the coordinator's ledger, so a resumed run
neither repeats nor skips prompt groups. ``trained_groups.jsonl`` records the prompt ids trained at each step (and
the version each group started under), so anyone can check exactly-once training across actor deaths and resumes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from async_rl.config import Config

__all__ = ["append_audit", "maybe_resume", "save_checkpoint", "truncate_audit"]

logger = logging.getLogger(__name__)

AUDIT_FILE = "trained_groups.jsonl"


def save_checkpoint(learner: Any, coordinator: Any, ckpt_dir: Path, step: int, keep_last: int | None) -> Path:
    """Checkpoint after ``step`` steps (every rank): model, optimizer and RNG states plus the coordinator's ledger."""
    extra = {"coordinator": coordinator.state_dict() if coordinator is not None else None, "step": step}
    return Path(learner.save_checkpoint(ckpt_dir, extra=extra, keep_last=keep_last))


def maybe_resume(cfg: Config, learner: Any, coordinator: Any, ckpt_dir: Path) -> int:
    """Load the checkpoint that ``trainer.resume_mode`` asks for; returns the step to continue from."""
    from async_rl.learner.checkpoint import resume_path

    path = resume_path(cfg.trainer.resume_mode, cfg.trainer.resume_from_path, ckpt_dir)
    if path is None:
        return 0
    extra = learner.load_checkpoint(path)
    state = extra if isinstance(extra, dict) else {}
    if coordinator is not None and state.get("coordinator") is not None:
        coordinator.load_state_dict(state["coordinator"])
    step = int(state.get("step", learner.version))
    logger.info("resumed from %s at policy version %d", path, learner.version)
    if learner.ctx.rank == 0:
        truncate_audit(ckpt_dir.parent, step)
    return step


def append_audit(out_dir: Path, step: int, groups: list[Any]) -> None:
    """Append the prompt ids trained at ``step`` and the version each group started under to the audit log."""
    record = {
        "step": step,
        "prompt_ids": [int(g.prompt_id) for g in groups],
        "start_versions": [int(g.version) for g in groups],
    }
    with open(out_dir / AUDIT_FILE, "a") as f:
        f.write(json.dumps(record) + "\n")


def truncate_audit(out_dir: Path, step: int) -> None:
    """Steps trained after the checkpoint were lost with the crash and will be trained again: drop their records."""
    path = out_dir / AUDIT_FILE
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)
