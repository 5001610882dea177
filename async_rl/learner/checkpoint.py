"""Crash-safe learner checkpoints: DCP for sharded model/optimizer state, msgpack for everything else.

:func:`save_trained` / :func:`load_trained` checkpoint any set of named :class:`~async_rl.learner.update.TrainedModel`
(model, optimizer, schedule, non-finite guard) at a step, with the caller's own msgpack-able fields; the RL
:class:`~async_rl.learner.step.Learner` (:func:`save_learner`: actor, critic, KL coefficient) and the reward model
(:mod:`async_rl.learner.reward_model`) both go through them. Layout of ``<root>/step_<N>/`` (``N`` = the step; the
policy version for the RL learner):

* ``dcp/``: ``torch.distributed.checkpoint`` of every trained model and its optimizer (sharded; each rank writes
  its own shards; loads into any world size);
* ``meta.msgpack``: the step, LR-scheduler states, non-finite counters, and the caller's fields (the RL learner's:
  the KL-controller coefficient and its ``extra`` state, bytes or a msgpack-able dict: the coordinator ledger, the
  data cursor);
* ``rng/rank_<r>.msgpack``: python, numpy, torch (and CUDA) RNG states of rank ``r``;
* ``COMMITTED``: written last.

A checkpoint is complete or ignored: everything is written into ``step_<N>.tmp/``; after a barrier rank 0 writes
``COMMITTED``, fsyncs and atomically renames the directory. :func:`latest` only returns directories with the marker,
so a crash mid-save (a leftover ``.tmp``) leaves the previous checkpoint as the latest; leftovers are removed by the
next successful save, which also prunes to ``keep_last``. Own files use msgpack, not pickle (DCP's own metadata
format is torch's business). Checkpoint roots must be on a filesystem every rank sees.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from async_rl.learner.dist import DistContext

if TYPE_CHECKING:
    from async_rl.learner.step import Learner
    from async_rl.learner.update import TrainedModel

__all__ = [
    "COMMITTED",
    "latest",
    "list_checkpoints",
    "load_learner",
    "load_trained",
    "resume_path",
    "save_learner",
    "save_trained",
]

logger = logging.getLogger(__name__)

COMMITTED = "COMMITTED"
_STEP_RE = re.compile(r"^step_(\d+)$")
_TMP_RE = re.compile(r"^step_(\d+)\.tmp$")


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Committed checkpoints under ``root`` as ``(step, path)``, oldest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for child in base.iterdir():
        m = _STEP_RE.match(child.name)
        if m and child.is_dir() and (child / COMMITTED).is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest(root: str | Path) -> Path | None:
    """The newest committed checkpoint under ``root`` (incomplete ``.tmp`` ones are ignored), or ``None``."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def resume_path(mode: str, from_path: str | None, root: str | Path) -> Path | None:
    """The checkpoint ``trainer.resume_mode`` asks for (verl's modes): ``'disable'`` = none; ``'resume_path'`` =
    ``from_path`` (``trainer.resume_from_path``); ``'auto'`` = the newest committed one under ``root``, if any."""
    if mode == "disable":
        return None
    if mode == "resume_path" and from_path:
        return Path(from_path)
    return latest(root)


def _rng_state() -> dict[str, Any]:
    py_version, py_state, py_gauss = random.getstate()
    np_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    state: dict[str, Any] = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [str(np_state[0]), np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().numpy().tobytes(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        cuda = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


@contextmanager
def _quiet_single_process(ctx: DistContext) -> Iterator[None]:
    """DCP warns that it assumes a single process when no process group exists; here that is the intent."""
    with warnings.catch_warnings():
        if not ctx.is_distributed:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dcp_state(trained: Mapping[str, TrainedModel]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for key, t in trained.items():
        model_sd, optim_sd = get_state_dict(t.model, t.optimizer)
        state[f"{key}.model"] = model_sd
        state[f"{key}.optim"] = optim_sd
    return state


def save_trained(
    ctx: DistContext,
    trained: Mapping[str, TrainedModel],
    root: str | Path,
    *,
    step: int,
    fields: dict[str, Any],
    keep_last: int | None,
) -> Path:
    """Checkpoint the ``trained`` models (by name) as ``<root>/step_<step>``, with the caller's msgpack-able
    ``fields`` in ``meta.msgpack``; call on every rank. Returns the committed path. ``keep_last``: keep the newest N
    checkpoints; None keeps all."""
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    base = Path(root)
    tmp, final = base / f"step_{step}.tmp", base / f"step_{step}"
    if ctx.is_rank0:
        base.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    ctx.barrier()
    with _quiet_single_process(ctx):
        dcp.save(_dcp_state(trained), checkpoint_id=str(tmp / "dcp"), no_dist=not ctx.is_distributed)
    _fsync_write(tmp / "rng" / f"rank_{ctx.rank}.msgpack", msgspec.msgpack.encode(_rng_state()))
    ctx.barrier()
    if ctx.is_rank0:
        meta = {
            "version": step,
            "world_size": ctx.world_size,
            "schedulers": {k: t.scheduler.state_dict() for k, t in trained.items()},
            "guards": {k: [t.guard.skipped_total, t.guard.consecutive] for k, t in trained.items()},
            **fields,
        }
        _fsync_write(tmp / "meta.msgpack", msgspec.msgpack.encode(meta))
        _fsync_write(tmp / COMMITTED, b"ok\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(base)
        _prune(base, keep_last, step)
        logger.info("checkpoint committed: %s", final)
    ctx.barrier()
    return final


def load_trained(ctx: DistContext, trained: Mapping[str, TrainedModel], path: str | Path) -> dict[str, Any]:
    """Restore the ``trained`` models (by name) and this rank's RNG states from a committed checkpoint; call on every
    rank. Returns ``meta.msgpack``: ``"version"`` (the step) and the caller's fields.

    Raises ``ValueError`` when ``path`` is not a committed checkpoint.
    """
    ckpt = Path(path)
    if not (ckpt / COMMITTED).is_file():
        raise ValueError(f"path {str(ckpt)!r} is not a committed checkpoint (no {COMMITTED} marker)")
    state = _dcp_state(trained)
    with _quiet_single_process(ctx):
        dcp.load(state, checkpoint_id=str(ckpt / "dcp"), no_dist=not ctx.is_distributed)
    for key, t in trained.items():
        set_state_dict(
            t.model, t.optimizer, model_state_dict=state[f"{key}.model"], optim_state_dict=state[f"{key}.optim"]
        )
    meta: dict[str, Any] = msgspec.msgpack.decode((ckpt / "meta.msgpack").read_bytes())
    for key, t in trained.items():
        t.scheduler.load_state_dict(meta["schedulers"][key])
        t.guard.skipped_total, t.guard.consecutive = meta["guards"][key]
    rng_file = ckpt / "rng" / f"rank_{ctx.rank}.msgpack"
    if rng_file.is_file():
        _set_rng_state(msgspec.msgpack.decode(rng_file.read_bytes()))
    else:
        logger.warning("no RNG state for rank %d in %s (world size changed?): RNG not restored", ctx.rank, ckpt)
    ctx.barrier()
    return meta


def _trained(learner: Learner) -> dict[str, TrainedModel]:
    out = {"actor": learner.actor}
    if learner.critic is not None:
        out["critic"] = learner.critic.trained
    return out


def save_learner(
    learner: Learner, root: str | Path, *, extra: bytes | dict[str, Any] | None, keep_last: int | None
) -> Path:
    """Checkpoint ``learner`` as ``<root>/step_<version>``; call on every rank. Returns the committed path.
    ``keep_last`` (``async_training.checkpoint.keep_last``): keep the newest N checkpoints; None keeps all."""
    kl_coef = None if learner.kl_ctrl is None else float(learner.kl_ctrl.value)
    fields = {"kl_coef": kl_coef, "extra": extra}
    return save_trained(learner.ctx, _trained(learner), root, step=learner.version, fields=fields, keep_last=keep_last)


def _prune(base: Path, keep_last: int | None, current: int) -> None:
    if keep_last is not None:
        for _, path in list_checkpoints(base)[:-keep_last]:
            shutil.rmtree(path, ignore_errors=True)
    for child in base.iterdir():
        m = _TMP_RE.match(child.name)
        if m and int(m.group(1)) != current:
            shutil.rmtree(child, ignore_errors=True)


def load_learner(learner: Learner, path: str | Path) -> bytes | dict[str, Any] | None:
    """Restore ``learner`` from a committed checkpoint directory; call on every rank. Returns the ``extra`` state.

    Raises ``ValueError`` when ``path`` is not a committed checkpoint.
    """
    meta = load_trained(learner.ctx, _trained(learner), path)
    if learner.kl_ctrl is not None and meta["kl_coef"] is not None:
        learner.kl_ctrl.value = float(meta["kl_coef"])
    learner.version = int(meta["version"])
    extra: bytes | dict[str, Any] | None = meta["extra"]
    return extra
