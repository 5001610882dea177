"""Benchmark where on-policy distillation's teacher should run: its prefill on the actor (a vLLM engine, prompt
log-probs; what ``distillation.enabled`` does) against a forward pass on the learner (what a learner-side teacher would
add to every step: the same cost as a reference pass), side by side on one model and one step's batch.

Usage: ``python tools/bench_teacher.py [--model builtin:smollm2-135m-instruct] [--groups 16] [--n 8] [--prompt-len 46]
[--response-len 12] [--rounds 3] [--threads 2]``

The defaults are the SmolLM2 recipe's geometry (16 prompts x 8 completions). The learner side is one FSDP2 rank in this
process (gloo), its precision ``auto`` (bf16 where the CPU computes it faster, :mod:`async_rl.config.precision`),
shared-prompt layout, computing the teacher's log-probs of every completion token with no gradient
(``Learner._log_probs``, the reference pass). The actor side is :class:`async_rl.actor.teacher.TeacherEngine` in the
rollout's dtype (``auto``) scoring the same completions, all groups at once, as an actor scoring overlapping groups
would. Rounds alternate the order; the ratio is learner forward time / teacher engine time (above 1: the engine scores a
step's samples faster than the learner's forward). Which side has slack is the other half of the answer: the recipe's
``actor/idle_seconds`` and ``learner/perf/step_time_s`` (docs/distillation.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from async_rl.tuning.bench import BenchLine, emit, paired_ratios  # noqa: E402


async def score_step(teacher: Any, groups: list[Any], prompts: dict[int, list[int]]) -> float:
    from async_rl.transport.protocol import unpack_array

    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            teacher.score(prompts[g.prompt_id], [unpack_array(c.token_ids).tolist() for c in g.completions])
            for g in groups
        )
    )
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model directory or builtin: name")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--n", type=int, default=8, help="completions per group")
    p.add_argument("--prompt-len", type=int, default=46)
    p.add_argument("--response-len", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch threads of the learner side")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from bench_learner import START, learner_config
    from bench_precision import context, make_groups

    from async_rl.actor.engine import actor_device
    from async_rl.actor.teacher import TeacherEngine
    from async_rl.config import load_config
    from async_rl.config.resolve import engine_start
    from async_rl.learner import Learner, teardown
    from async_rl.learner.precision import cpu_native_bf16
    from async_rl.runtime import resources

    ctx = context(local=False)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = resources.resolve_model_path(args.model, tmp)
        from transformers import AutoConfig

        groups, prompts = make_groups(args, int(AutoConfig.from_pretrained(model_path).vocab_size))
        rows = args.groups * args.n
        cfg = learner_config(groups, prompts, mini=args.groups, micro=rows, layout="shared", lr=1e-6, overrides=())
        learner = Learner(cfg, START, ctx, model_path)
        batch = learner.collate(groups, prompts)
        rollout_cfg = load_config(
            [],
            [
                f"data.max_prompt_length={args.prompt_len}",
                f"data.max_response_length={args.response_len}",
                f"actor_rollout_ref.rollout.max_num_seqs={max(rows, 16)}",
                "actor_rollout_ref.rollout.enforce_eager=true",
            ],
        )
        teacher = TeacherEngine(
            rollout_cfg, engine_start(rollout_cfg, model_path=model_path, device_type=actor_device())
        )

        def forward() -> float:
            t0 = time.perf_counter()
            with torch.no_grad():
                learner._log_probs(learner.model, batch)
            return time.perf_counter() - t0

        async def run() -> tuple[list[float], list[float]]:
            await teacher.start()
            try:
                forward()
                await score_step(teacher, groups, prompts)  # warm-up
                fwd, eng = [], []
                for r in range(args.rounds):
                    if r % 2 == 0:
                        fwd.append(forward())
                        eng.append(await score_step(teacher, groups, prompts))
                    else:
                        eng.append(await score_step(teacher, groups, prompts))
                        fwd.append(forward())
                    print(f"round {r + 1}: learner forward {fwd[-1]:.3f} s, teacher engine {eng[-1]:.3f} s", flush=True)
                return fwd, eng
            finally:
                await teacher.shutdown()

        tokens = sum(len(prompts[g.prompt_id]) + c.token_ids.length for g in groups for c in g.completions)
        print(
            f"model {args.model}: learner {learner.compute_dtype} ({torch.get_num_threads()} threads), engine"
            f" {teacher.startup.dtype}; native CPU bf16: {cpu_native_bf16()}; {args.groups}x{args.n} completions,"
            f" {tokens} tokens",
            flush=True,
        )
        fwd, eng = asyncio.run(run())
    teardown(ctx)
    summary = paired_ratios([f / e for f, e in zip(fwd, eng, strict=True)])
    detail = (
        f"learner forward {statistics.median(fwd):.3f} s vs teacher engine {statistics.median(eng):.3f} s per step"
        f" (medians of {args.rounds}); {summary.describe()}"
    )
    print(f"learner_forward / teacher_engine = {summary.geomean:.3f}; {detail}")
    emit("teacher", [BenchLine("teacher_engine_vs_learner_forward", summary.geomean, None, detail)])


if __name__ == "__main__":
    main()
