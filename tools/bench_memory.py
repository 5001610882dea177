"""Benchmark a learner rank's peak memory on a recipe's step and model: the system malloc against tcmalloc, or the
fused output layer against logits.

Usage: ``python tools/bench_memory.py --model DIR [--geometry recipe|calculator] [--steps 3]
[--compare allocator|fused|checkpointing] [--interval 3]``
(``DIR``: e.g. the SmolLM2 directory ``python tools/prepare_model.py smollm2-135m-instruct --out DIR`` writes)

``--compare allocator`` (the default): each allocator runs ``torchrun`` with 2 ranks (gloo on CPU, one thread per
rank) that build the learner from the recipe's config (``configs/smollm2_arith_grpo.yaml`` for ``recipe``,
``configs/smollm2_calculator_tool_grpo.yaml`` for ``calculator``) and train ``--steps`` steps of the geometry's
batch, each followed by a gather of every weight as the weight sync does. It prints, per allocator, the peak resident
memory of rank 0 (``ru_maxrss``, what a run reports as ``learner/peak_memory_mib``), the bytes of that peak per token
the rank trained in one step, and the median step time; then the system/tcmalloc ratio of the peaks
(``learner_peak_memory_system_vs_tcmalloc``). Geometries (prompts x completions, tokens): ``recipe`` 16 x 8,
46-token prompts, 8-12-token completions; ``calculator`` 8 x 8, 300-token prompts, 64-128-token episodes.

``--compare fused``: the same runs, both on tcmalloc, with ``actor_rollout_ref.model.use_fused_kernels`` false and
true (log-probs from the hidden states, no ``[tokens, vocab]`` logits kept), and the logits/fused ratio of the peaks
(``learner_peak_memory_logits_vs_fused_output``).

``--compare checkpointing``: both on tcmalloc, with activation checkpointing on every decoder layer and on every
``--interval``-th (``actor_rollout_ref.model.gradient_checkpointing_interval``), and the ratio of the peaks
(``learner_peak_memory_interval_k_vs_every_layer``) with the step times beside it: what fewer recomputed layers cost in
memory and save in time on this host, in the precision ``auto`` picks here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_rl.runtime.allocator import find_tcmalloc, search_dirs  # noqa: E402
from async_rl.tuning.bench import BenchLine, emit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "recipe": "configs/smollm2_arith_grpo.yaml",
    "calculator": "configs/smollm2_calculator_tool_grpo.yaml",
}


def worker(params: dict[str, object]) -> None:
    import torch
    from bench_learner import shared_groups, token_count

    from async_rl.config.cli import parse_cli
    from async_rl.config.resolve import learner_start
    from async_rl.learner import Learner, init_distributed, teardown
    from async_rl.runtime.trainer import peak_memory_mib

    torch.set_num_threads(1)
    model = str(params["model"])
    cfg, _ = parse_cli(
        [
            "--config",
            str(ROOT / CONFIGS[str(params["geometry"])]),
            f"actor_rollout_ref.model.path={model}",
            f"actor_rollout_ref.model.use_fused_kernels={str(params['fused']).lower()}",
            f"actor_rollout_ref.model.gradient_checkpointing_interval={params['interval']}",
        ]
    )
    ctx = init_distributed(backend="auto", timeout_s=1800.0)
    # synthetic groups: pad id 0; the recipes' 16 steps as the schedule's horizon
    learner = Learner(cfg, learner_start(cfg, pad_token_id=0, total_training_steps=16), ctx, model)
    groups, prompts = shared_groups(str(params["geometry"]), learner.vocab_size or 49152)
    tokens = token_count(groups, prompts) / ctx.world_size
    times = []
    for _ in range(int(str(params["steps"]))):
        t0 = time.perf_counter()
        learner.train_step(groups, prompts)
        times.append(time.perf_counter() - t0)
        for _name, _tensor in learner.iter_weights(dtype=None):  # the weight sync's gather, one tensor at a time
            pass
    if ctx.is_rank0:
        peak = peak_memory_mib(ctx.device) * 2**20  # what the run's learner/peak_memory_mib reports
        out = {"peak_bytes": peak, "tokens": tokens, "step_s": statistics.median(times)}
        Path(str(params["out"])).write_text(json.dumps(out))
    teardown(ctx)


def run(args: argparse.Namespace, library: str | None, out: Path, *, fused: bool, interval: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__]
    params = {
        "model": args.model,
        "geometry": args.geometry,
        "steps": args.steps,
        "out": str(out),
        "fused": fused,
        "interval": interval,
    }
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", BENCH_MEMORY_WORKER=json.dumps(params))
    if library is not None:
        env["LD_PRELOAD"] = library
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result: dict[str, float] = json.loads(out.read_text())
    return result


def main() -> None:
    params = os.environ.get("BENCH_MEMORY_WORKER")
    if params:  # a torchrun rank of run(): its options travel in the environment
        worker(json.loads(params))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF directory of the model (e.g. SmolLM2)")
    p.add_argument("--geometry", choices=sorted(CONFIGS), default="recipe")
    p.add_argument("--steps", type=int, default=3, help="steps per run (the peak is over all of them)")
    p.add_argument(
        "--compare",
        choices=("allocator", "fused", "checkpointing"),
        default="allocator",
        help="what the runs differ in",
    )
    p.add_argument(
        "--interval", type=int, default=3, help="--compare checkpointing: every k-th layer against every one"
    )
    args = p.parse_args()
    library = find_tcmalloc(search_dirs(os.environ))
    if library is None and args.compare == "allocator":
        print("no libtcmalloc on this host (apt-get install libtcmalloc-minimal4): nothing to compare")
        return
    if args.interval < 2:
        raise SystemExit(f"--interval must be at least 2 (1 is every layer, the baseline), got {args.interval}")
    if args.compare == "allocator":
        runs = {"system": (None, False, 1), "tcmalloc": (library, False, 1)}
        name = "learner_peak_memory_system_vs_tcmalloc"
    elif args.compare == "fused":
        runs = {"logits": (library, False, 1), "fused": (library, True, 1)}
        name = "learner_peak_memory_logits_vs_fused_output"
    else:  # the larger peak first, as in the other comparisons
        runs = {f"every{args.interval}": (library, False, args.interval), "every1": (library, False, 1)}
        name = "learner_peak_memory_interval_k_vs_every_layer"
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (lib, fused, interval) in runs.items():
            results[label] = run(args, lib, Path(tmp) / f"{label}.json", fused=fused, interval=interval)
    print(f"== learner peak memory, rank 0 of 2 ({args.geometry}, {args.steps} steps, {args.model}) ==")
    for label, r in results.items():
        per_token = r["peak_bytes"] / r["tokens"]
        line = f"{label:8s} peak {r['peak_bytes'] / 2**20:,.0f} MiB  {per_token / 1e6:.2f} MB/token trained"
        print(f"{line}  step {r['step_s']:.1f} s")
    (a_name, a), (b_name, b) = results.items()
    ratio = a["peak_bytes"] / b["peak_bytes"]
    print(f"{a_name}/{b_name} peak: {ratio:.2f}x")
    detail = (
        f"{args.geometry}: peak {a['peak_bytes'] / 2**20:,.0f} -> {b['peak_bytes'] / 2**20:,.0f} MiB per rank"
        f" ({a['peak_bytes'] / a['tokens'] / 1e6:.2f} -> {b['peak_bytes'] / b['tokens'] / 1e6:.2f} MB/token);"
        f" step {a['step_s']:.1f} -> {b['step_s']:.1f} s"
    )
    emit("memory", [BenchLine(name, ratio, None, detail)])


if __name__ == "__main__":
    main()
