"""Benchmark the learner's compute precision: the same learner step in fp32 and in bf16 mixed precision
(``actor.fsdp_config.mixed_precision.param_dtype`` fp32 vs bf16), side by side on one model and one fixed batch.

Usage: ``python tools/bench_precision.py [--model builtin:tiny-arith | DIR | builtin:NAME] [--steps 3] [--groups 4]
[--n 4] [--prompt-len 32] [--response-len 64] [--threads N] [--local] [--allocator auto|tcmalloc|system]``

It runs on the C allocator a run's learner ranks use (``--allocator``, as ``async_training.cpu_allocator``: ``auto``
re-runs the tool on tcmalloc where found). On the system malloc fp32 steps were slower and erratic: on an Intel Xeon
without AMX, one thread, fp32 took 5.0-8.8 s a step against 3.2-3.5 s on tcmalloc, and the ratio said bf16 was
faster (1.11) where on tcmalloc, as in the recipe, fp32 was (0.66).

Both learners start from the same weights. A step is forward + backward + AdamW step over the same batch (synthetic
groups of random tokens, one mini-batch, so the proximal pass is skipped). After one warm-up step each, rounds
interleave the two (the order alternates each round), so drift on a shared machine hits both alike; the ratio is
fp32 step time / bf16 step time (above 1: bf16 is faster), the median of the per-round ratios with their spread.
Before any update it also reports the mean |log-prob difference| between the two precisions over the batch's
response tokens. By default the learner is one FSDP2 rank (a gloo group of one in this process, NCCL with a GPU), so
bf16 is FSDP2's ``MixedPrecisionPolicy`` as under torchrun; ``--local`` measures the single-process path
(``torch.autocast``) instead. Nothing is downloaded (``builtin:`` models are built or converted from installed
wheels, see ``async_rl.runtime.resources``).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, get_args

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from async_rl import metric_catalog as mc  # noqa: E402
from async_rl.config.names import CpuAllocator  # noqa: E402
from async_rl.tuning.bench import BenchLine, emit  # noqa: E402

PRECISIONS = ("fp32", "bf16")


def context(local: bool) -> Any:
    """``local_context()``, or a process group of one rank in this process (unless torchrun already set one up)."""
    from async_rl.learner import init_distributed, local_context

    if local:
        return local_context()
    if "WORLD_SIZE" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    return init_distributed(backend="auto", timeout_s=1800.0)


def make_groups(args: argparse.Namespace, vocab: int) -> tuple[list[Any], dict[int, list[int]]]:
    from async_rl.learner.batching import local_group
    from async_rl.transport.protocol import make_completion

    rng = random.Random(0)
    groups, prompts = [], {}
    for g in range(args.groups):
        prompts[g] = [rng.randrange(3, vocab) for _ in range(args.prompt_len)]
        completions = [
            make_completion(
                [rng.randrange(3, vocab) for _ in range(args.response_len)],
                [-1.0] * args.response_len,
                version_min=0,
                reward=rng.random(),
            )
            for _ in range(args.n)
        ]
        groups.append(local_group(g, completions))
    return groups, prompts


def build(
    args: argparse.Namespace, ctx: Any, model_path: str, groups: list[Any], prompts: dict[int, list[int]]
) -> dict[str, Any]:
    from bench_learner import START, learner_config

    from async_rl.learner import Learner

    rows = args.groups * args.n
    learners = {}
    for pd in PRECISIONS:
        cfg = learner_config(
            groups,
            prompts,
            mini=args.groups,  # one optimizer step per train_step: no proximal pass
            micro=args.micro or rows,
            layout="shared",
            lr=1e-6,
            overrides=(f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={pd}",),
        )
        learners[pd] = Learner(cfg, START, ctx, model_path)
        assert learners[pd].compute_dtype == (torch.float32 if pd == "fp32" else torch.bfloat16)
    return learners


def timed_step(learner: Any, groups: list[Any], prompts: dict[int, list[int]]) -> float:
    t0 = time.perf_counter()
    metrics = learner.train_step(groups, prompts)
    elapsed = time.perf_counter() - t0
    assert metrics[mc.LEARNER_ACTOR_PROXIMAL_PASS_SKIPPED] == 1.0, "the step should be one optimizer step"
    assert metrics[mc.LEARNER_ACTOR_SKIPPED_UPDATES] == 0.0, "a non-finite update was skipped"
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="builtin:tiny-arith", help="model directory or builtin: name")
    p.add_argument("--steps", type=int, default=3, help="timed rounds, each one step of each precision")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps of each precision first")
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--n", type=int, default=4, help="responses per group")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--response-len", type=int, default=64)
    p.add_argument("--micro", type=int, default=0, help="sequences per micro-batch (0: the whole batch)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--local", action="store_true", help="single-process path (autocast) instead of one FSDP2 rank")
    p.add_argument(
        "--allocator",
        choices=get_args(CpuAllocator),
        default="auto",
        help="C allocator, as async_training.cpu_allocator (auto: tcmalloc where found, as a run's learner ranks)",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from async_rl.runtime.allocator import plan_allocator, reexec_with_allocator, search_dirs

    # a run's ranks re-run themselves on tcmalloc; on the system malloc fp32 steps were up to 1.8x slower and erratic
    reexec_with_allocator(args.allocator, [__file__], announce=False)
    allocator = plan_allocator(args.allocator, os.environ, search_dirs(os.environ))[1]
    if args.threads:
        torch.set_num_threads(args.threads)
    from async_rl.learner import teardown
    from async_rl.learner.precision import cpu_native_bf16
    from async_rl.runtime import resources

    ctx = context(args.local)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = resources.resolve_model_path(args.model, tmp)
        from transformers import AutoConfig

        groups, prompts = make_groups(args, int(AutoConfig.from_pretrained(model_path).vocab_size))
        learners = build(args, ctx, model_path, groups, prompts)
        fp32 = learners["fp32"]
        batch = fp32.collate(groups, prompts)
        mask = batch.response_mask.bool()
        lp = {pd: learner._log_probs(learner.model, batch) for pd, learner in learners.items()}
        diff = (lp["fp32"] - lp["bf16"]).abs()[mask]
        n_params = sum(p.numel() for p in fp32.model.parameters()) * ctx.world_size  # shards: about the total
        tokens = sum(len(prompts[g.prompt_id]) + c.token_ids.length for g in groups for c in g.completions)
        path = "single process (autocast)" if args.local else f"FSDP2 x{ctx.world_size} ({ctx.backend})"
        print(
            f"model {args.model}: {n_params / 1e6:.1f}M params; {ctx.device.type}, {path}, {torch.get_num_threads()}"
            f" threads, native CPU bf16: {cpu_native_bf16()}; batch {len(groups)}x{args.n} sequences, {tokens} tokens;"
            f" {allocator}",
            flush=True,
        )
        magnitude = float(lp["fp32"].abs()[mask].mean())
        print(
            f"log-probs fp32 vs bf16 (same weights, {int(mask.sum())} response tokens, mean |log p| {magnitude:.3f}):"
            f" mean |diff| {float(diff.mean()):.3e}, max {float(diff.max()):.3e}",
            flush=True,
        )
        for _ in range(args.warmup):
            for learner in learners.values():
                timed_step(learner, groups, prompts)
        times: dict[str, list[float]] = {pd: [] for pd in PRECISIONS}
        for r in range(args.steps):
            for pd in PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]:
                times[pd].append(timed_step(learners[pd], groups, prompts))
            print(f"round {r + 1}: fp32 {times['fp32'][-1]:.3f} s, bf16 {times['bf16'][-1]:.3f} s", flush=True)
    teardown(ctx)
    ratios = [a / b for a, b in zip(times["fp32"], times["bf16"], strict=True)]
    t32, t16 = statistics.median(times["fp32"]), statistics.median(times["bf16"])
    ratio = statistics.median(ratios)
    detail = (
        f"step {t32:.3f} s fp32 vs {t16:.3f} s bf16 (median of {args.steps}); per-round ratio"
        f" {min(ratios):.3f}-{max(ratios):.3f}; log-prob mean |diff| {float(diff.mean()):.1e}"
    )
    print(f"fp32_time / bf16_time = {ratio:.3f} (above 1: bf16 faster); {detail}")
    emit("precision", [BenchLine("precision_fp32_vs_bf16_step", ratio, None, detail)])


if __name__ == "__main__":
    main()
