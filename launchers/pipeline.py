"""Run training stages one after another from one config: SFT, reward-model training, RL, on-policy distillation and
rejection-sampling generation, each stage's export (a model, or a generated dataset) the input of the next ones.

    python launchers/pipeline.py --config configs/pipelines/smollm2_calculator_sft_rl.yaml [--dry-run] [key=value ...]

The file's format is ``async_rl.config.pipeline.PipelineConfig``: a ``run_dir`` and a list of ``stages``, each with a
``kind`` (``sft``, ``rm``, ``rl``, ``opd``, ``generate``), its own ``config`` and ``overrides``, and ``inputs``
mapping a key of its config to an earlier stage whose export it gets (a model directory; a ``generate`` stage's jsonl
of kept samples, or parquet when its ``rejection_sampling.output`` names a .parquet file). Each stage runs in
``<run_dir>/<name>`` through its own entry point (``async_rl.entrypoints.sft`` or
``train_reward_model`` under torchrun, ``launchers/local.py`` for RL and for generation), so its logs, metrics and
checkpoints are where that entry point puts them.

**Restart.** A stage that finished writes ``<run_dir>/<name>/stage_done.json`` (its export, command and duration), and
a rerun of the pipeline skips it. An interrupted stage is run again with the same run directory, so it resumes from its
newest checkpoint when its config writes checkpoints (``trainer.save_freq`` for SFT and reward models,
``async_training.checkpoint`` for RL), else it starts over. A stage that fails stops the pipeline with its exit code,
naming the stage and its run directory. Ctrl-C / SIGTERM are passed to the running stage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from async_rl.config.loader import build_raw  # noqa: E402
from async_rl.config.pipeline import PipelineConfig, StageConfig, load_pipeline_config  # noqa: E402

logger = logging.getLogger("pipeline")

DONE_FILE = "stage_done.json"
# where each kind's run writes what it hands on: a model directory, or the generated dataset
EXPORT = {"sft": "hf", "rm": "hf", "rl": "final_hf", "opd": "final_hf", "generate": "rejection_sampling.jsonl"}
ENTRY = {"sft": "async_rl.entrypoints.sft", "rm": "async_rl.entrypoints.train_reward_model"}


def stage_dir(cfg: PipelineConfig, stage: StageConfig) -> Path:
    return Path(cfg.run_dir) / stage.name


def export_path(cfg: PipelineConfig, stage: StageConfig) -> Path:
    """Where ``stage``'s run writes what it hands on. A ``generate`` stage writes its rows in its run directory, as
    parquet when its config's ``rejection_sampling.output`` names a .parquet file, else as jsonl."""
    export = stage_dir(cfg, stage) / EXPORT[stage.kind]
    if stage.kind != "generate":
        return export
    asked = build_raw([stage.config], stage.overrides).get("rejection_sampling", {}).get("output")
    return export.with_suffix(".parquet") if Path(str(asked)).suffix == ".parquet" else export


def stage_command(cfg: PipelineConfig, stage: StageConfig, exports: dict[str, Path]) -> list[str]:
    """The command of ``stage``, its inputs filled from ``exports`` (stage name -> exported model directory)."""
    out = stage_dir(cfg, stage)
    inputs = [f"{key}={exports[source]}" for key, source in stage.inputs.items()]
    keys = [*stage.overrides, *inputs, f"trainer.default_local_dir={out}"]
    if stage.kind == "generate":  # one learner process whatever the RL config it reuses says
        keys += [
            "rejection_sampling.enable=true",
            f"rejection_sampling.output={export_path(cfg, stage)}",
            "trainer.n_gpus_per_node=1",
        ]
    if stage.kind == "opd":
        keys.append("distillation.enabled=true")
    if stage.kind in ("rl", "opd", "generate"):
        actors = ["--actors", str(stage.actors)] if stage.actors else []
        return [
            sys.executable,
            str(REPO / "launchers" / "local.py"),
            "--config",
            stage.config,
            "--run-dir",
            str(out),
            "--nproc-per-node",
            str(stage.nproc_per_node),
            *actors,
            *keys,
        ]
    ranks = stage.nproc_per_node
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launch += [] if ranks == 1 else [f"--nproc-per-node={ranks}"]
    return [*launch, "-m", ENTRY[stage.kind], "--config", stage.config, *keys]


def _run(cmd: list[str]) -> int:
    """Run ``cmd`` in its own session, passing SIGINT/SIGTERM on to its whole process group."""
    proc = subprocess.Popen(cmd, cwd=os.getcwd(), start_new_session=True)

    def forward(signum: int, _frame: Any) -> None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_pipeline(cfg: PipelineConfig, *, dry_run: bool) -> int:
    """Run every stage that has not finished, in order; 0, or the failing stage's exit code."""
    exports: dict[str, Path] = {}
    total = len(cfg.stages)
    for i, stage in enumerate(cfg.stages, start=1):
        out = stage_dir(cfg, stage)
        done = out / DONE_FILE
        export = export_path(cfg, stage)
        if done.is_file():
            logger.info("stage %d/%d %s: finished before (%s); skipped", i, total, stage.name, done)
            exports[stage.name] = Path(json.loads(done.read_text())["export"])
            continue
        cmd = stage_command(cfg, stage, exports)
        logger.info("stage %d/%d %s (%s): %s", i, total, stage.name, stage.kind, shlex.join(cmd))
        exports[stage.name] = export
        if dry_run:
            continue
        started = time.monotonic()
        rc = _run(cmd)
        if rc != 0:
            logger.error("stage %s failed with exit code %d; its run directory: %s", stage.name, rc, out)
            return rc
        if not (export.is_file() if stage.kind == "generate" else (export / "config.json").is_file()):
            logger.error("stage %s exited 0 but exported nothing at %s", stage.name, export)
            return 1
        record = {"export": str(export), "command": cmd, "seconds": time.monotonic() - started, "finished": time.time()}
        done.write_text(json.dumps(record, indent=2) + "\n")
        logger.info("stage %d/%d %s finished in %.0f s: %s", i, total, stage.name, record["seconds"], export)
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the pipeline's YAML file")
    p.add_argument("--dry-run", action="store_true", help="print the stages' commands and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of the pipeline file (run_dir=...)")
    args = p.parse_args(argv)
    cfg, _ = load_pipeline_config([args.config], args.overrides)
    return run_pipeline(cfg, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
