"""The rejection-sampling job (``rejection_sampling.enable``): the actors generate, nothing is trained.

It runs in the learner's place (one process, launched as training is) and uses the rollout plane as training does:
the coordinator grants every training prompt exactly once (one pass, ``data.train_batch_size`` groups at a time),
the actors sample ``actor_rollout_ref.rollout.n`` completions under the policy they loaded (version 0: no weight sync)
and score them with the configured reward (rule or reward model), and every delivered group goes through the same
ledger. Of each group the samples at or above ``rejection_sampling.threshold`` are kept, at most
``rejection_sampling.best_k`` of them, highest scores first (:func:`select_samples`; a kept sample whose text is
empty, a model that stopped at once, is left out and counted), and appended to a jsonl journal as rows that
``async_rl.entrypoints.sft`` reads as they are::

    {"prompt": <the prompt: its text, or its chat messages>, "response": "<the sample's text>", "score": 1.0,
     "prompt_id": 17, "sample": 3, "finish_reason": "stop", "ground_truth": "71"}

The journal is the output when ``rejection_sampling.output`` is a .jsonl file. For a .parquet output it is
``<run dir>/rejection_sampling.jsonl``, and the parquet file (the same rows and columns) is written from it when the
job ends, atomically; a stopped job leaves no parquet file, its rerun resumes the journal.

**Exactly once, across restarts.** After every ``async_training.checkpoint.save_every_n_steps`` batches (and at the
end, and on SIGTERM) a checkpoint holds the coordinator's ledger and the number of rows written
(``<run dir>/checkpoints/rejection_sampling.msgpack``, replaced atomically). A rerun of the same command
(``trainer.resume_mode=auto``) cuts the journal back to that many rows and restores the ledger: prompts written after
the checkpoint are granted again, prompts before it never are, so no prompt is generated twice into the output or lost.

Validation is training's (``trainer.val_before_train``: a round on the held-out prompts under the policy that
generates), so this stage's curve point sits beside the RL stages'.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from async_rl import metric_catalog as mc
from async_rl.config import Config
from async_rl.runtime import resources
from async_rl.runtime.graceful_stop import GracefulStop
from async_rl.transport.protocol import RolloutGroup, unpack_array

__all__ = ["OUTPUT_FILE", "RejectionSampler", "select_samples", "write_parquet"]

logger = logging.getLogger(__name__)

OUTPUT_FILE = "rejection_sampling.jsonl"
STATE_FILE = "rejection_sampling.msgpack"


def select_samples(scores: Sequence[float], *, threshold: float, best_k: int | None) -> list[int]:
    """Indices of the kept samples of one group: score >= ``threshold``, the ``best_k`` highest (ties: the earlier
    sample first), in sample order."""
    kept = [i for i, s in enumerate(scores) if s >= threshold]
    if best_k is not None and len(kept) > best_k:
        kept = sorted(sorted(kept, key=lambda i: -scores[i])[:best_k])
    return kept


def write_parquet(journal: Path, output: Path) -> None:
    """The journal's jsonl rows as one parquet table at ``output`` (written to a temporary file, then renamed).
    A chat prompt is a list of ``{role, content}`` structs there, as verl's parquet prompts are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, output)


class RejectionSampler:
    """The job's one process (see the module docstring); :meth:`run` runs it and returns the summary."""

    def __init__(self, cfg: Config, ctx: Any, stop: GracefulStop) -> None:
        from async_rl.runtime.trainer import load_prompts
        from async_rl.runtime.validation import build_validator
        from async_rl.transport import Coordinator, GroupSampling

        if ctx.world_size != 1:
            raise ValueError("rejection_sampling.enable=true runs one learner process (trainer.n_gpus_per_node=1)")
        self.cfg, self.ctx, self.stop = cfg, ctx, stop
        self.out_dir = resources.run_dir(cfg)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        policy_path = resources.resolve_model_path(cfg.actor_rollout_ref.model.path, self.out_dir)
        self.tokenizer = resources.load_tokenizer(cfg, policy_path)
        records, _ = load_prompts(cfg, ctx, self.tokenizer)
        assert records is not None  # rank 0
        self.records = records
        self.coordinator = Coordinator(
            records,
            cfg.async_training,
            groups_per_step=cfg.data.train_batch_size,
            sampling=GroupSampling.from_config(cfg, seed=cfg.trainer.seed),
            seed=cfg.trainer.seed,
            shuffle_seed=cfg.data.seed if cfg.data.shuffle else None,
            max_epochs=1,  # every prompt exactly once
            autostart=False,
            vocab_size=None,
            filter_groups=None,
        )
        rs = cfg.rejection_sampling
        self.output = Path(os.path.expanduser(rs.output)) if rs.output else self.out_dir / OUTPUT_FILE
        self.journal = self.output if self.output.suffix == ".jsonl" else self.out_dir / OUTPUT_FILE
        self.state_path = self.out_dir / "checkpoints" / STATE_FILE
        self.rows = 0
        self.batches = 0
        self.seen = 0  # samples scored
        self.empty = 0  # kept by score but left out: an empty response
        self._resume()
        self.sink = self._open_sink()
        self.started = time.monotonic()
        self.validator = build_validator(cfg, ctx, self.coordinator, self.tokenizer, self._log_validation)
        logger.info(
            "rejection sampling: %d prompts x %d samples, keeping score >= %g%s, into %s",
            len(records),
            cfg.actor_rollout_ref.rollout.n,
            rs.threshold,
            "" if rs.best_k is None else f" (at most {rs.best_k} per prompt)",
            self.output,
        )

    def _open_sink(self) -> Any:
        from async_rl.config import config_to_dict
        from async_rl.runtime.metrics import MetricsLogger

        t = self.cfg.trainer
        total = -(-len(self.records) // self.cfg.data.train_batch_size)
        return MetricsLogger(
            self.out_dir,
            list(t.logger),
            project=t.project_name,
            experiment=t.experiment_name,
            total_steps=total,
            config=config_to_dict(self.cfg),
        )

    def _log_validation(self, step: int, values: dict[str, float]) -> None:
        self.sink.log(step, {**values, mc.TIME_WALL_S: time.monotonic() - self.started})

    # ------------------------------------------------------------------ exactly once
    def _resume(self) -> None:
        """Restore the ledger and cut the output back to the rows the checkpoint counted (``trainer.resume_mode``)."""
        if self.cfg.trainer.resume_mode == "disable" or not self.state_path.is_file():
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            self.journal.write_text("")
            return
        state = msgspec.msgpack.decode(self.state_path.read_bytes())
        self.coordinator.load_state_dict(state["coordinator"])
        self.rows, self.batches, self.seen = int(state["rows"]), int(state["batches"]), int(state["seen"])
        self.empty = int(state["empty"])
        lines = self.journal.read_text().splitlines(keepends=True) if self.journal.is_file() else []
        if len(lines) < self.rows:
            raise ValueError(f"{self.journal} has {len(lines)} rows but its checkpoint counted {self.rows}")
        self.journal.write_text("".join(lines[: self.rows]))  # rows after the checkpoint are generated again
        logger.info("resumed after %d batches: %d rows kept in %s", self.batches, self.rows, self.journal)

    def _save(self) -> None:
        state = {
            "coordinator": self.coordinator.state_dict(),
            "rows": self.rows,
            "batches": self.batches,
            "seen": self.seen,
            "empty": self.empty,
        }
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.msgpack.encode(state))
        os.replace(tmp, self.state_path)

    # ------------------------------------------------------------------ the job
    def _rows(self, group: RolloutGroup) -> list[dict[str, Any]]:
        rs = self.cfg.rejection_sampling
        extras = self.coordinator.source.record(group.prompt_id).extras
        prompt = extras.get("messages", extras["prompt"])
        scores = [float(c.reward) for c in group.completions]
        eos = self.tokenizer.eos_token_id
        out = []
        for j in select_samples(scores, threshold=rs.threshold, best_k=rs.best_k):
            ids = [int(t) for t in unpack_array(group.completions[j].token_ids)]
            if ids and ids[-1] == eos:
                ids = ids[:-1]  # the SFT rendering adds the end of turn back
            text = str(self.tokenizer.decode(ids, skip_special_tokens=False))
            if not text:  # the sample stopped at once: nothing to demonstrate (SFT refuses an empty response)
                self.empty += 1
                continue
            out.append(
                {
                    "prompt": prompt,
                    "response": text,
                    "score": scores[j],
                    "prompt_id": group.prompt_id,
                    "sample": j,
                    "finish_reason": group.completions[j].finish_reason,  # "length": cut at max_response_length
                    "ground_truth": extras.get("ground_truth"),
                }
            )
        return out

    def run(self) -> dict[str, Any]:
        """Generate until every prompt was delivered once; the summary (``{"stopped": True, ...}`` after a signal)."""
        cfg = self.cfg
        t = cfg.async_training.timeouts
        every = cfg.async_training.checkpoint.save_every_n_steps
        self.coordinator.start()
        if self.validator.at_start():
            self.validator.start(0)
        patience = t.step_s + t.actor_start_s  # the first batch also waits for the actors to start
        waiting = time.monotonic()
        while True:
            if self.stop.agreed(self.ctx):
                self._save()
                self._close()
                logger.warning("stopped by signal after %d batches; %d rows kept", self.batches, self.rows)
                return {"stopped": True, "steps": self.batches, "rows": self.rows}
            try:  # the stop flag is checked every 2 s while the actors generate
                groups = self.coordinator.get_groups(cfg.data.train_batch_size, timeout_s=2.0)
            except TimeoutError:
                if time.monotonic() - waiting > patience:
                    raise TimeoutError(
                        f"no {cfg.data.train_batch_size} groups within {patience:.0f} s: are the actors running?"
                    ) from None
                continue
            patience, waiting = t.step_s, time.monotonic()
            if not groups:
                break
            started = time.monotonic()
            rows = [row for g in groups for row in self._rows(g)]
            with self.journal.open("a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
                f.flush()
                os.fsync(f.fileno())
            self.coordinator.mark_trained([g.prompt_id for g in groups])
            self.rows += len(rows)
            self.batches += 1
            samples = sum(len(g.completions) for g in groups)
            self.seen += samples
            if every and self.batches % every == 0:
                self._save()
            self.validator.poll()
            scores = [float(c.reward) for g in groups for c in g.completions]
            self.sink.log(
                self.batches,
                {
                    mc.RS_GROUPS: float(len(groups)),
                    mc.RS_SAMPLES: float(samples),
                    mc.RS_KEPT: float(len(rows)),
                    mc.RS_KEPT_TOTAL: float(self.rows),
                    mc.RS_KEPT_FRACTION_TOTAL: self.rows / max(self.seen, 1),
                    mc.RS_SCORE_MEAN: sum(scores) / len(scores),
                    mc.RS_EMPTY_TOTAL: float(self.empty),
                    mc.RS_WRITE_S: time.monotonic() - started,
                    mc.TIME_WALL_S: time.monotonic() - self.started,
                },
            )
        self._save()
        self.validator.wait()
        self._close()
        if self.output != self.journal:
            write_parquet(self.journal, self.output)
        logger.info("rejection sampling done: %d of %d samples kept in %s", self.rows, self.seen, self.output)
        return {"export": str(self.output), "rows": self.rows, "samples": self.seen, "batches": self.batches}

    def _close(self) -> None:
        self.coordinator.close(notify_actors=True)
        self.sink.close()
