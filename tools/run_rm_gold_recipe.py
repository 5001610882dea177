"""The gold-metric reward-model recipe end to end: pairs, reward model, RL against it, the gold-vs-proxy plot.

    python tools/run_rm_gold_recipe.py [--train-prompts 1024] [--eval-prompts 128] [--n 4] [--nproc 2]
        [key=value ...]          # overrides for the RL stage (configs/smollm2_arith_rm_gold.yaml)

Stages, each skipped when its output already exists (delete the directory to redo one):

1. ``pairs``: ``tools/make_preference_pairs.py``: SmolLM2 samples ``--n`` answers to training and held-out prompts,
   the gold scorer ranks them, best against worst -> ``outputs/smollm2_rm_gold/pairs/{train,eval}.jsonl``;
2. ``rm``: the reward model on those pairs (``configs/reward_model/smollm2_gold.yaml``, torchrun over ``--nproc``
   ranks) -> ``outputs/smollm2_rm_gold/rm/hf``;
3. ``rl``: GRPO against the reward model alone (``configs/smollm2_arith_rm_gold.yaml``, ``launchers/local.py``), the
   gold logged in training and validation -> ``outputs/smollm2_rm_gold/rl`` (done when ``final_hf`` exists);
4. ``plot``: ``python -m async_rl.runtime.plot_gold`` (gold and proxy against step and KL, and their table) and the
   run's usual plot.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("outputs/smollm2_rm_gold")
RL_CONFIG = "configs/smollm2_arith_rm_gold.yaml"
RM_CONFIG = "configs/reward_model/smollm2_gold.yaml"


def _torchrun() -> list[str]:
    beside = Path(sys.executable).parent / "torchrun"
    return [str(beside)] if beside.is_file() else [shutil.which("torchrun") or "torchrun"]


def stages(args: argparse.Namespace) -> list[tuple[str, Path | None, list[list[str]]]]:
    """(name, the output that marks it done (None: always run), its commands)."""
    py = sys.executable
    pairs = [
        py, "tools/make_preference_pairs.py", "--config", RL_CONFIG, "--out", str(OUT / "pairs"),
        "--train-prompts", str(args.train_prompts), "--eval-prompts", str(args.eval_prompts), "--n", str(args.n),
    ]  # fmt: skip
    rm = [*_torchrun(), "--standalone", "--nproc-per-node", str(args.nproc), "-m"]
    rm += ["async_rl.entrypoints.train_reward_model", "--config", RM_CONFIG]
    rl = [py, "launchers/local.py", "--config", RL_CONFIG, "--run-dir", str(OUT / "rl"), *args.overrides]
    plot = [
        [py, "-m", "async_rl.runtime.plot_gold", str(OUT / "rl")],
        [py, "-m", "async_rl.runtime.plot", str(OUT / "rl")],
    ]
    return [
        ("pairs", OUT / "pairs" / "summary.json", [pairs]),
        ("rm", OUT / "rm" / "hf" / "reward_stats.json", [rm]),
        ("rl", OUT / "rl" / "final_hf", [rl]),
        ("plot", None, plot),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-prompts", type=int, default=1024)
    p.add_argument("--eval-prompts", type=int, default=128)
    p.add_argument("--n", type=int, default=4, help="samples per prompt for the pairs")
    p.add_argument("--nproc", type=int, default=2, help="reward-model training ranks")
    p.add_argument("overrides", nargs="*", help="dotted overrides for the RL stage")
    args = p.parse_args(argv)
    for name, done, commands in stages(args):
        if done is not None and (ROOT / done).exists():
            print(f"== {name}: done ({done} exists), skipped", flush=True)
            continue
        print(f"== {name}", flush=True)
        started = time.monotonic()
        for cmd in commands:
            print("   $ " + " ".join(cmd), flush=True)
            rc = subprocess.run(cmd, cwd=ROOT, check=False).returncode
            if rc != 0:
                print(f"== {name} failed (exit {rc}) after {time.monotonic() - started:.0f} s", flush=True)
                return rc
        print(f"== {name}: {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
