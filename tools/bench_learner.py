"""Benchmark the learner step: shared prompts vs separate sequences, sequence packing vs padding, and FSDP2 over 2
ranks vs 1 rank on the same work.

Usage: ``python tools/bench_learner.py [--groups 16] [--n 4] [--steps 3] [--hidden 256] [--layers 4]``
``python tools/bench_learner.py --shared-only --geometry recipe --model DIR`` (``DIR``: e.g. the SmolLM2 directory
``python tools/prepare_model.py smollm2-135m-instruct --out DIR`` writes)

Part 0 (one process, ``--threads``) trains one batch of the chosen ``--geometry`` with each group's prompt computed
once (``use_shared_prompt``) and as separate padded sequences (the layout before shared prompts), in interleaved
rounds, and prints the geometric mean of the per-round step-time ratios with its 95% interval and the tokens each
layout computed (``learner_shared_prompt_vs_unshared``). Geometries: ``recipe`` is the SmolLM2 GRPO recipe's step
(16 prompts of 46 tokens x 8 completions of 8-12 tokens, micro-batches of 64 as the recipe's ranks take them, one
optimizer step), ``long`` is 4 prompts of 64 tokens x 8 completions of 256 tokens (micro-batches of 8).

Part 1 (one process) trains the same batch of rollout groups, whose response lengths have a long tail like real
rollouts, with padded micro-batches and with packed ones, and prints update tokens/s, padding waste and the ratio.
Part 2 launches ``torchrun`` with 1 and then 2 ranks (gloo on CPU, NCCL when GPUs are present; one thread per rank)
on the same global batch and prints step time and tokens/s of each and the speed-up. The tiny Qwen2 is built in code;
nothing is downloaded. Everything runs on the C allocator a run's learner ranks use (``--allocator``, as
``async_training.cpu_allocator``: ``auto`` is tcmalloc where found).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, get_args

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from async_rl import metric_catalog as mc  # noqa: E402
from async_rl.config import Config, load_config  # noqa: E402
from async_rl.config.names import CpuAllocator  # noqa: E402
from async_rl.config.resolve import LearnerStart  # noqa: E402
from async_rl.learner import (  # noqa: E402
    Learner,
    init_distributed,
    local_context,
    teardown,
)
from async_rl.learner.batching import local_group  # noqa: E402
from async_rl.runtime.allocator import reexec_with_allocator  # noqa: E402
from async_rl.transport.protocol import RolloutGroup, make_completion  # noqa: E402
from async_rl.tuning.bench import BenchLine, emit, paired_ratios  # noqa: E402

GEOMETRIES = {  # groups, n, prompt tokens, response tokens (low, high), micro-batch
    "recipe": (16, 8, 46, (8, 12), 64),  # micro-batch: the recipe's ppo_micro_batch_size_per_gpu (16 before 2026-12-07)
    "long": (4, 8, 64, (256, 256), 8),
    "calculator": (8, 8, 300, (64, 128), 8),  # the calculator-tool recipe's step, as tools/bench_memory.py runs it
}


def build_model(hidden: int, layers: int, vocab: int) -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=2048,
    )
    return Qwen2ForCausalLM(cfg).float()


Prompts = dict[int, list[int]]  # each group's prompt tokens, by prompt id


def make_groups(num_groups: int, n: int, vocab: int, seed: int = 0) -> tuple[list[RolloutGroup], Prompts]:
    """Prompts of 16..96 tokens; responses mostly short with a long tail (exponential, capped at 512)."""
    rng = random.Random(seed)
    groups, prompts = [], {}
    for g in range(num_groups):
        prompts[g] = [rng.randrange(1, vocab) for _ in range(rng.randint(16, 96))]
        completions = []
        for _ in range(n):
            length = min(512, 8 + int(rng.expovariate(1 / 80)))
            tokens = [rng.randrange(1, vocab) for _ in range(length)]
            completions.append(make_completion(tokens, [-3.0] * length, version_min=0, reward=rng.random()))
        groups.append(local_group(g, completions))
    return groups, prompts


def token_count(groups: list[RolloutGroup], prompts: Prompts) -> int:
    """Prompt and response tokens of every sequence of ``groups``."""
    return sum(len(prompts[g.prompt_id]) + c.token_ids.length for g in groups for c in g.completions)


START = LearnerStart(pad_token_id=0, total_training_steps=0)  # synthetic token ids; a constant schedule


def learner_config(
    groups: list[RolloutGroup],
    prompts: Prompts,
    *,
    mini: int,
    micro: int,
    layout: str,
    lr: float,
    overrides: tuple[str, ...] = (),
) -> Config:
    """A GRPO learner's config for ``groups`` (their n and longest prompt/response as the length limits): ``mini``
    prompts per optimizer step, ``micro`` sequences per micro-batch, no importance weights, seed 0."""
    arr = "actor_rollout_ref"
    return load_config(
        None,
        [
            "algorithm.adv_estimator=grpo",
            f"data.train_batch_size={len(groups)}",
            f"data.max_prompt_length={max(len(prompts[g.prompt_id]) for g in groups)}",
            f"data.max_response_length={max(c.token_ids.length for g in groups for c in g.completions)}",
            f"{arr}.rollout.n={len(groups[0].completions)}",
            f"{arr}.actor.ppo_mini_batch_size={mini}",
            f"{arr}.actor.ppo_micro_batch_size_per_gpu={micro}",
            f"{arr}.rollout.log_prob_micro_batch_size_per_gpu={micro}",
            f"{arr}.model.use_shared_prompt={str(layout == 'shared').lower()}",
            f"{arr}.model.use_remove_padding={str(layout == 'packed').lower()}",
            f"{arr}.model.enable_gradient_checkpointing=false",
            f"{arr}.actor.optim.lr={lr}",
            "algorithm.rollout_correction.rollout_is=null",
            "trainer.seed=0",
            *overrides,
        ],
    )


def make_settings(args: argparse.Namespace, groups: list[RolloutGroup], prompts: Prompts, packed: bool) -> Config:
    return learner_config(
        groups, prompts, mini=args.groups // 2, micro=args.micro, layout="packed" if packed else "padded", lr=1e-5
    )


def timed_step(learner: Learner, groups: list[RolloutGroup], prompts: Prompts) -> dict[str, float]:
    t0 = time.perf_counter()
    metrics = learner.train_step(groups, prompts)
    elapsed = time.perf_counter() - t0
    tokens = token_count(groups, prompts)
    return {
        "step_s": elapsed,
        "tokens_per_s": tokens / elapsed,
        "padding_waste": metrics[mc.LEARNER_BATCH_PADDING_WASTE],
        "imbalance": metrics[mc.LEARNER_BATCH_TOKEN_IMBALANCE],
    }


def best(runs: list[dict[str, float]]) -> dict[str, float]:
    """The fastest run: the machine is shared, so the minimum is the least disturbed measurement."""
    return min(runs, key=lambda r: r["step_s"])


def bench_packing(args: argparse.Namespace) -> BenchLine:
    torch.set_num_threads(1)  # like the FSDP workers; extra threads only add noise on a shared machine
    groups, prompts = make_groups(args.groups, args.n, args.vocab)
    learners = {
        packed: Learner(
            make_settings(args, groups, prompts, packed),
            START,
            local_context(),
            lambda: build_model(args.hidden, args.layers, args.vocab),
        )
        for packed in (False, True)
    }
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for learner in learners.values():
        timed_step(learner, groups, prompts)  # warm-up
    for _ in range(args.steps):  # interleaved, so both modes see the same background load
        for packed, learner in learners.items():
            runs[packed].append(timed_step(learner, groups, prompts))
    pad, pack = best(runs[False]), best(runs[True])
    print(f"== packing vs padding (1 process, 1 thread, same batch, best of {args.steps}) ==")
    for name, r in (("padded", pad), ("packed", pack)):
        print(f"{name:7s} step {r['step_s']:.3f}s  tokens/s {r['tokens_per_s']:.0f}  waste {r['padding_waste']:.3f}")
    print(f"packed/padded tokens/s ratio: {pack['tokens_per_s'] / pad['tokens_per_s']:.2f}x")
    detail = f"{pack['tokens_per_s']:.0f} / {pad['tokens_per_s']:.0f} tok/s, padding waste {pad['padding_waste']:.2f}"
    return BenchLine("learner_packed_vs_padded", pack["tokens_per_s"] / pad["tokens_per_s"], None, detail)


def shared_groups(geometry: str, vocab: int, seed: int = 0) -> tuple[list[RolloutGroup], Prompts]:
    groups_n, n, prompt_len, (low, high), _ = GEOMETRIES[geometry]
    rng = random.Random(seed)
    groups, prompts = [], {}
    for g in range(groups_n):
        prompts[g] = [rng.randrange(1, vocab) for _ in range(prompt_len)]
        completions = []
        for _ in range(n):
            length = rng.randint(low, high)
            tokens = [rng.randrange(1, vocab) for _ in range(length)]
            completions.append(make_completion(tokens, [-3.0] * length, version_min=0, reward=rng.random()))
        groups.append(local_group(g, completions))
    return groups, prompts


def bench_shared(args: argparse.Namespace) -> BenchLine:
    from async_rl.learner.model import load_causal_lm

    torch.set_num_threads(args.threads)
    groups_n, n, _, _, micro = GEOMETRIES[args.geometry]

    def source() -> nn.Module:
        return load_causal_lm(args.model) if args.model else build_model(args.hidden, args.layers, args.vocab)

    vocab = int(source().config.vocab_size)
    groups, prompts = shared_groups(args.geometry, vocab)
    learners = {}
    for shared in (True, False):
        # one optimizer step, as the recipe
        lay = "shared" if shared else "padded"
        s = learner_config(groups, prompts, mini=groups_n, micro=micro, layout=lay, lr=1e-6)
        learners[shared] = Learner(s, START, local_context(), source)
    tokens = {
        shared: learner.train_step(groups, prompts)[mc.LEARNER_BATCH_TOKENS_COMPUTED]
        for shared, learner in learners.items()
    }
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):  # interleaved, alternating which goes first, so both see the same background load
        for shared in (True, False) if r % 2 == 0 else (False, True):
            times[shared].append(timed_step(learners[shared], groups, prompts)["step_s"])
    summary = paired_ratios([u / s for u, s in zip(times[False], times[True], strict=True)])
    model = args.model or f"tiny Qwen2 (hidden {args.hidden}, {args.layers} layers)"
    what = f"{args.geometry}: {groups_n} x {n}, {model}, {args.threads} threads"
    print(f"== shared prompts vs separate sequences ({what}) ==")
    for shared, name in ((True, "shared"), (False, "separate")):
        t = sorted(times[shared])
        spread = f"median {t[len(t) // 2]:.3f}s  range {t[0]:.3f}-{t[-1]:.3f}s"
        print(f"{name:8s} step {spread}  tokens computed {tokens[shared]:.0f}")
    print(f"separate/shared step time: {summary.describe()}")
    detail = (
        f"{args.geometry}: step {summary.describe()}; tokens computed {tokens[False]:.0f} -> {tokens[True]:.0f}"
        f" ({tokens[False] / tokens[True]:.2f}x fewer)"
    )
    return BenchLine("learner_shared_prompt_vs_unshared", summary.geomean, None, detail)


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    ctx = init_distributed(backend="auto", timeout_s=1800.0)
    groups, prompts = make_groups(args.groups, args.n, args.vocab)
    learner = Learner(
        make_settings(args, groups, prompts, True),
        START,
        ctx,
        lambda: build_model(args.hidden, args.layers, args.vocab),
    )
    timed_step(learner, groups, prompts)  # warm-up
    result = best([timed_step(learner, groups, prompts) for _ in range(args.steps)])
    if ctx.is_rank0:
        Path(args.out).write_text(json.dumps(result))
    teardown(ctx)


def bench_fsdp(args: argparse.Namespace) -> BenchLine | None:
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        print("== FSDP 2 ranks vs 1: skipped (needs 2 GPUs) ==")
        return None
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (1, 2):
            out = Path(tmp) / f"r{ranks}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
            cmd += [__file__]
            # worker options travel in the environment: torchrun's own parser would claim options like --n
            params = {k: getattr(args, k) for k in ("groups", "n", "steps", "hidden", "layers", "vocab", "micro")}
            params["out"] = str(out)
            env = dict(
                os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", BENCH_LEARNER_WORKER=json.dumps(params)
            )
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            results[ranks] = json.loads(out.read_text())
    print(f"== FSDP2: 2 ranks vs 1 rank (same global batch, packed, 1 thread per rank, best of {args.steps}) ==")
    for ranks, r in results.items():
        line = f"{ranks} rank(s): step {r['step_s']:.3f}s  tokens/s {r['tokens_per_s']:.0f}"
        print(f"{line}  imbalance {r['imbalance']:.3f}")
    ratio = results[2]["tokens_per_s"] / results[1]["tokens_per_s"]
    print(f"2-rank/1-rank tokens/s ratio: {ratio:.2f}x (ideal 2.00x)")
    detail = f"{results[2]['tokens_per_s']:.0f} / {results[1]['tokens_per_s']:.0f} tok/s (ideal 2.00)"
    return BenchLine("learner_fsdp_2_vs_1_rank", ratio, None, detail)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="timed steps per configuration (the best one counts)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--skip-fsdp", action="store_true")
    p.add_argument("--geometry", choices=sorted(GEOMETRIES), default="recipe", help="shared-prompt part's batch")
    p.add_argument("--model", default=None, help="HF directory for the shared-prompt part (default: tiny Qwen2)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds of the shared-prompt part")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the shared-prompt part")
    p.add_argument("--shared-only", action="store_true", help="run only the shared-prompt part")
    p.add_argument(
        "--allocator",
        choices=get_args(CpuAllocator),
        default="auto",
        help="C allocator, as async_training.cpu_allocator (auto: tcmalloc where found, as a run's learner ranks)",
    )
    args = p.parse_args()
    # a run's learner ranks re-run themselves on tcmalloc (glibc's malloc fragments over steps); its workers inherit it
    reexec_with_allocator(args.allocator, [__file__], announce=True)
    worker_params = os.environ.get("BENCH_LEARNER_WORKER")
    if worker_params:
        worker(argparse.Namespace(**json.loads(worker_params)))
        return
    if args.groups % 2 or args.groups < 2:
        raise ValueError(f"--groups must be an even number >= 2, got {args.groups}")
    lines = [bench_shared(args)]
    if args.shared_only:
        emit("learner", lines)
        return
    torch.set_num_threads(1)
    lines.append(bench_packing(args))
    if not args.skip_fsdp:
        fsdp = bench_fsdp(args)
        if fsdp is not None:
            lines.append(fsdp)
    emit("learner", lines)


if __name__ == "__main__":
    main()
