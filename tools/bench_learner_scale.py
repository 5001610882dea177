"""Benchmark the FSDP2 learner at a real model's size: a Qwen2.5-0.5B-shaped model on the GSM8K recipe's batch.

Usage: ``python tools/bench_learner_scale.py [--shape qwen2.5-0.5b] [--nproc 1] [--steps 3] [--cases all] [--profile]``

The model is built in code from Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query / 2 key-value heads, MLP 4864,
151,936-token vocabulary, tied embeddings; random weights, nothing downloaded). Each case launches ``torchrun`` with
``--nproc`` ranks (NCCL on GPUs, gloo on CPU) that build the learner from ``configs/qwen2.5-0.5b_gsm8k_grpo.yaml``
(with the case's overrides) and train synthetic rollout groups: one warm-up step, then ``--steps`` timed steps. Per
rank, a step is one optimizer step on the recipe's per-rank mini-batch (64 prompts x 8 completions over 4 ranks: 16
groups of 8), with the recipe's KL loss (a reference forward) and token-level rollout correction.

Cases (``--cases``, comma-separated, or ``all``):

* ``shared``: each group's prompt computed once (``use_shared_prompt=true``), ``param_dtype: auto``, activation
  checkpointing;
* ``separate``: each completion with its own copy of the prompt, padding-free (``use_shared_prompt=false``: the
  recipe as shipped);
* ``no_ckpt``: shared prompts without activation checkpointing;
* ``fp32``: shared prompts in fp32 (``param_dtype=fp32``);
* ``long``: shared prompts, 2 groups of 8 completions of 1,024 tokens after 256-token prompts (the recipe's longest
  responses).

The ``gsm8k`` batch: 160-token prompts, completions of 128-512 tokens. Each case prints the median step time; the
batch's tokens per second, counted as separate sequences would count them (prompt and completion); training FLOP/s
(6 x parameters x tokens computed: the policy's forward and backward; the reference forward and checkpointing's
recomputation are extra work on top); peak device memory (CUDA's peak allocation and reservation, or the process's
peak resident set on CPU); and the first step's loss, entropy and gradient norm (the same for every layout of the
same batch, up to rounding). Then the ratio lines ``learner_scale_shared_vs_separate`` (step time),
``learner_scale_ckpt_memory`` (peak memory without / with checkpointing) and ``learner_scale_auto_vs_fp32`` (step
time).

``--profile`` runs one more step of each case under ``torch.profiler`` and prints the operators that took the most
device time, and how busy the device was over that step.

``--shape tiny`` (hidden 64, 2 layers, 512-token vocabulary, short sequences) is for checking the tool on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.tuning.bench import BenchLine, emit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "qwen2.5-0.5b_gsm8k_grpo.yaml"

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}

# groups, completions per group, prompt tokens, completion tokens (low, high)
BATCHES = {"gsm8k": (16, 8, 160, (128, 512)), "long": (2, 8, 256, (1024, 1024))}
TINY_BATCHES = {"gsm8k": (16, 8, 24, (8, 32)), "long": (2, 8, 32, (128, 128))}

CASES: dict[str, tuple[str, list[str]]] = {  # batch, overrides of the recipe
    "shared": ("gsm8k", []),
    "separate": ("gsm8k", ["actor_rollout_ref.model.use_shared_prompt=false"]),
    "no_ckpt": ("gsm8k", ["actor_rollout_ref.model.enable_gradient_checkpointing=false"]),
    "fp32": ("gsm8k", ["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32"]),
    "long": ("long", []),
}


def build_model(shape: str) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape])).float()


def make_batch(shape: str, batch: str, vocab: int, seed: int = 0) -> tuple[list[Any], dict[int, list[int]]]:
    import random

    from async_rl.learner.batching import local_group
    from async_rl.transport.protocol import make_completion

    groups_n, n, prompt_len, (low, high) = (TINY_BATCHES if shape == "tiny" else BATCHES)[batch]
    rng = random.Random(seed)
    groups, prompts = [], {}
    for g in range(groups_n):
        prompts[g] = [rng.randrange(1, vocab) for _ in range(prompt_len)]
        completions = []
        for _ in range(n):
            tokens = [rng.randrange(1, vocab) for _ in range(rng.randint(low, high))]
            # behaviour log-probs near the random model's (-log vocab), so the importance weights stay sane
            behaviour = [-12.0 if shape != "tiny" else -6.2] * len(tokens)
            completions.append(make_completion(tokens, behaviour, version_min=0, reward=rng.random()))
        groups.append(local_group(g, completions))
    return groups, prompts


def worker(params: dict[str, Any]) -> None:
    import torch

    from async_rl import metric_catalog as mc
    from async_rl.config.cli import parse_cli
    from async_rl.config.resolve import learner_start
    from async_rl.learner import Learner, init_distributed, teardown

    torch.set_num_threads(max(1, int(params["threads"])))
    shape, case = str(params["shape"]), str(params["case"])
    batch, overrides = CASES[case]
    groups_n, n = (TINY_BATCHES if shape == "tiny" else BATCHES)[batch][:2]
    ctx = init_distributed(backend="auto", timeout_s=1800.0)
    per_rank = groups_n * ctx.world_size
    arr = "actor_rollout_ref"
    cfg, _ = parse_cli(
        [
            "--config",
            str(CONFIG),
            f"data.train_batch_size={per_rank}",
            f"{arr}.actor.ppo_mini_batch_size={per_rank}",
            f"{arr}.rollout.n={n}",
            f"trainer.n_gpus_per_node={ctx.world_size}",
            "trainer.nnodes=1",
            "trainer.seed=0",
            f"{arr}.model.use_shared_prompt=true",  # the cases' base; ``separate`` turns it off
            *overrides,
        ]
    )
    learner = Learner(cfg, learner_start(cfg, pad_token_id=0, total_training_steps=16), ctx, lambda: build_model(shape))
    vocab = int(SHAPES[shape]["vocab_size"])
    groups, prompts = make_batch(shape, batch, vocab, seed=ctx.rank)
    with torch.device("meta"):  # the whole model's parameters (a rank's FSDP2 shards hold a part of them)
        n_params = sum(p.numel() for p in build_model(shape).parameters())

    def sync() -> None:
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    first = learner.train_step(groups, prompts)  # warm-up (kernels, allocator, optimizer state)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    times, updates, computed = [], [], 0.0
    for _ in range(int(params["steps"])):
        sync()
        t0 = time.perf_counter()
        metrics = learner.train_step(groups, prompts)
        sync()
        times.append(time.perf_counter() - t0)
        updates.append(float(metrics[mc.LEARNER_PERF_UPDATE_TIME_S]))
        computed = float(metrics[mc.LEARNER_BATCH_TOKENS_COMPUTED])
    profile_text = profile_step(lambda: learner.train_step(groups, prompts), sync) if params.get("profile") else ""
    if ctx.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(ctx.device) / 2**20
        reserved = torch.cuda.max_memory_reserved(ctx.device) / 2**20
        device = torch.cuda.get_device_name(ctx.device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        reserved = peak
        device = "cpu"
    if ctx.is_rank0:
        step = statistics.median(times)
        out = {
            "case": case,
            "device": device,
            "ranks": ctx.world_size,
            "params": n_params,
            "step_s": step,
            "steps_s": times,
            "update_s": statistics.median(updates),
            "profile": profile_text,
            "tokens_computed": computed,  # this rank's
            "sequences": groups_n * n,
            "sequence_tokens": sum(
                len(prompts[g.prompt_id]) + c.token_ids.length for g in groups for c in g.completions
            ),
            "peak_mib": peak,
            "reserved_mib": reserved,
            "pg_loss": float(first[mc.LEARNER_ACTOR_PG_LOSS]),
            "entropy": float(first[mc.LEARNER_ACTOR_ENTROPY]),
            "grad_norm": float(first[mc.LEARNER_ACTOR_GRAD_NORM]),
        }
        Path(str(params["out"])).write_text(json.dumps(out))
    teardown(ctx)


def profile_step(step: Any, sync: Any) -> str:
    """One more step under ``torch.profiler``: the operators that took the most device time (CPU time on a CPU),
    and how busy the device was over the step's wall clock (a launch-bound step leaves it idle)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    sync()
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        step()
        sync()
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = events.table(sort_by=key, row_limit=25, max_name_column_width=70)
    busy = sum(float(getattr(e, key)) for e in events) / 1e6
    return f"{table}\nprofiled step {wall:.3f} s (profiler on), {'device' if cuda else 'CPU'} busy {busy:.3f} s"


def run_case(args: argparse.Namespace, case: str, out: Path) -> dict[str, Any] | None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", __file__]
    params = dict(
        shape=args.shape, case=case, steps=args.steps, threads=args.threads, out=str(out), profile=args.profile
    )
    env = dict(os.environ, PYTHONWARNINGS="ignore", BENCH_SCALE_WORKER=json.dumps(params))
    env.setdefault("OMP_NUM_THREADS", str(args.threads))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:  # one case's failure (out of memory, say) must not hide the others' numbers
        print(f"-- case {case} failed (exit {proc.returncode}) after {time.perf_counter() - t0:.0f} s:")
        print(proc.stdout[-3000:])
        return None
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def main() -> None:
    params = os.environ.get("BENCH_SCALE_WORKER")
    if params:  # a torchrun rank of run_case(): its options travel in the environment
        worker(json.loads(params))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--nproc", type=int, default=1, help="learner ranks (GPUs)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per case, after one warm-up step")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--profile", action="store_true", help="profile one more step of each case; print its top ops")
    p.add_argument("--cases", default="all", help=f"comma-separated, from {', '.join(CASES)}; or all")
    args = p.parse_args()
    cases = list(CASES) if args.cases == "all" else args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"--cases: unknown {unknown}; choose from {list(CASES)}")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            res = run_case(args, case, Path(tmp) / f"{case}.json")
            if res is None:
                continue
            results[case] = res
            flops = 6 * res["params"] * res["tokens_computed"] / res["step_s"]
            print(
                f"{case:9s} [{res['device']}, {res['ranks']} rank(s)] step {res['step_s']:.3f} s"
                f" (range {min(res['steps_s']):.3f}-{max(res['steps_s']):.3f}; updates {res['update_s']:.3f} s)"
                f"  {res['sequences']} seqs of {res['sequence_tokens']} tokens, {res['tokens_computed']:.0f} computed"
                f"  {res['sequence_tokens'] / res['step_s']:,.0f} seq tok/s  {flops / 1e12:.2f} TFLOP/s"
                f"  peak {res['peak_mib']:,.0f} MiB (reserved {res['reserved_mib']:,.0f})"
                f"  step-1 pg_loss {res['pg_loss']:.5f} entropy {res['entropy']:.4f} grad_norm {res['grad_norm']:.4f}",
                flush=True,
            )
            if res["profile"]:
                print(f"-- {case}: one profiled step\n{res['profile']}", flush=True)
    lines = []
    r = results
    if "shared" in r and "separate" in r:
        ratio = r["separate"]["step_s"] / r["shared"]["step_s"]
        detail = (
            f"step {r['separate']['step_s']:.3f} -> {r['shared']['step_s']:.3f} s, tokens computed"
            f" {r['separate']['tokens_computed']:.0f} -> {r['shared']['tokens_computed']:.0f}; entropy"
            f" {r['separate']['entropy']:.4f} vs {r['shared']['entropy']:.4f}"
        )
        lines.append(BenchLine("learner_scale_shared_vs_separate", ratio, None, detail))
    if "shared" in r and "no_ckpt" in r:
        ratio = r["no_ckpt"]["peak_mib"] / r["shared"]["peak_mib"]
        detail = (
            f"peak {r['no_ckpt']['peak_mib']:,.0f} -> {r['shared']['peak_mib']:,.0f} MiB, step"
            f" {r['no_ckpt']['step_s']:.3f} -> {r['shared']['step_s']:.3f} s"
        )
        lines.append(BenchLine("learner_scale_ckpt_memory", ratio, None, detail))
    if "shared" in r and "fp32" in r:
        ratio = r["fp32"]["step_s"] / r["shared"]["step_s"]
        detail = f"step {r['fp32']['step_s']:.3f} (fp32) vs {r['shared']['step_s']:.3f} s (auto)"
        lines.append(BenchLine("learner_scale_auto_vs_fp32", ratio, None, detail))
    if lines:
        emit("learner_scale", lines)


if __name__ == "__main__":
    main()
