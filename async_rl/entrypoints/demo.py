"""The embedded CPU demo (``make demo``): asynchronous GRPO on integer arithmetic with a tiny model built here.

Nothing is downloaded. In order:

1. build a tiny Qwen2 and its char-level tokenizer in code, and give it a short supervised warm start on generated
   arithmetic problems (the SFT entry point on ``configs/sft/demo_warmstart.yaml``), so it starts imperfect but able;
2. measure greedy exact-match accuracy on held-out problems;
3. train it with asynchronous GRPO through ``launchers/local.py``: one vLLM actor (CPU build) streaming rollout
   groups over ZeroMQ to a 2-rank FSDP2 learner (gloo), weights broadcast after every step, staleness bound K >= 1.
   The system validates on the actor as it trains (``trainer.test_freq``; the config samples 4 answers to each of 200
   held-out problems at the training temperature, ``val/mean@4``), each round pinned to one policy version;
4. measure held-out greedy accuracy again on the exported final model, print a summary (reward over the first and
   last 10% of steps, the validation curve) and the path of the plot, whose validation panels show that curve.

::

    python -m async_rl.entrypoints.demo [--config configs/demo_ppo.yaml] [--out outputs/demo] [dotted.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
logger = logging.getLogger("async_rl.demo")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "demo_grpo.yaml"), help="demo config YAML")
    parser.add_argument("--out", default="outputs/demo", help="run directory (model, logs, metrics, plot)")
    parser.add_argument("--warmstart-steps", type=int, default=1000, help="supervised warm-start steps")
    parser.add_argument("--eval-problems", type=int, default=200, help="held-out problems for greedy accuracy")
    parser.add_argument("--nproc-per-node", type=int, default=2, help="learner ranks")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args, overrides = parse_args(argv)
    from async_rl.config import load_config
    from async_rl.config.names import needs_critic

    cfg = load_config([args.config], overrides)  # fail on a bad config before spending minutes on the warm-start
    import torch

    from async_rl.data import make_arith_problems
    from async_rl.demo.warmstart import greedy_accuracy, prepare_warm_model
    from async_rl.runtime.metrics import read_metrics
    from async_rl.runtime.plot import VAL_REWARD_KEY, format_summary, plot_run, summarize_run, validation_records

    torch.set_num_threads(2)
    started = time.monotonic()
    out = Path(args.out).resolve()
    held_out = make_arith_problems(args.eval_problems, seed=0, digits=2, split="eval")
    model_dir, ws = prepare_warm_model(out / "warm_start", steps=args.warmstart_steps, held_out=held_out)
    before_raw, before = ws["heldout_greedy_accuracy_raw"], ws["heldout_greedy_accuracy"]
    logger.info(
        "warm-start: %d steps in %.0f s, loss %.3f; held-out greedy accuracy %.3f (untrained %.3f)",
        args.warmstart_steps,
        ws["warmstart/seconds"],
        ws["warmstart/loss"],
        before,
        before_raw,
    )

    run_dir = out / "run"
    cmd = [
        sys.executable,
        str(REPO_ROOT / "launchers" / "local.py"),
        "--config",
        args.config,
        "--nproc-per-node",
        str(args.nproc_per_node),
        f"actor_rollout_ref.model.path={model_dir}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
    ]
    if needs_critic(cfg.algorithm.adv_estimator):
        # The critic starts from the warm policy's features (a fresh value head on a model that already reads the
        # problems); a randomly initialised critic would spend the run learning to read arithmetic.
        cmd.append(f"critic.model.path={model_dir}")
    cmd += overrides
    logger.info("training: %s", " ".join(cmd))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, check=False)
    if proc.returncode != 0:
        logger.error("training failed (exit %d); logs are under %s", proc.returncode, run_dir / "logs")
        return proc.returncode

    after = greedy_accuracy(run_dir / "final_hf", held_out)
    records = read_metrics(run_dir / "metrics.jsonl")
    summary = summarize_run(records)
    plot = plot_run(run_dir / "metrics.jsonl", run_dir / "reward.png")
    curve = [[rec["step"], rec[VAL_REWARD_KEY]] for rec in validation_records(records) if VAL_REWARD_KEY in rec]
    result = {
        "heldout_validation": curve,
        "heldout_greedy_accuracy_before": before,
        "heldout_greedy_accuracy_after": after,
        "reward_first_10pct": summary.get("reward_first_mean"),
        "reward_last_10pct": summary.get("reward_last_mean"),
        "reward_delta": summary.get("reward_delta"),
        "steps": summary.get("steps"),
        "wall_clock_s": round(time.monotonic() - started, 1),
        "plot": str(plot),
        "metrics": str(run_dir / "metrics.jsonl"),
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(format_summary(summary))
    if curve:
        vk = cfg.actor_rollout_ref.rollout.val_kwargs
        how = f"mean of {vk.n} samples at temperature {vk.temperature:g}" if vk.do_sample else "greedy"
        points = ", ".join(f"{value:.3f} (step {step})" for step, value in curve)
        print(f"held-out reward validated on the actor ({how}): {points}")
    print(f"held-out greedy accuracy: {before:.3f} before RL -> {after:.3f} after")
    print(f"total wall clock {result['wall_clock_s']} s; plot: {plot}; summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
