"""Benchmark: the actor's generation engine vs raw vLLM on the same prompts, sampling and engine, in one run.

    python tools/bench_actor.py [--prompts 256] [--n 4] [--max-tokens 64] [--rounds 32] [--model DIR] [--no-pin]

Both sides use one ``AsyncLLM`` (so start-up, weights and KV cache are shared): "raw" submits every prompt with
``AsyncLLM.generate`` (``n`` completions, per-token log-probs, final output only); "actor" submits the same prompts
through :class:`async_rl.actor.engine.GenerationEngine` (final outputs too, behaviour log-probs, version spans,
prefix cache salted by version). Each round times both, back to back in alternating order, and gives one paired ratio of
generated tokens/s, and one of tokens per CPU second of the whole process tree (vLLM's engine core included). The
line printed last is the geometric mean of the paired ratios (target >= 0.9) with its 95% confidence interval, the
median and the range (:func:`async_rl.tuning.bench.paired_ratios`).

Rounds are long (256 prompts x 4 = 1,024 sequences in flight, ~10 s a side here) and many. On this 2-core machine
single rounds' ratios spread 0.67-1.42 (the machine runs slower at times, for seconds, and a slow spell lands on one
side of a pair at random), about 12% per round on the log scale; 32 rounds (~11 minutes) put the 95% interval at about
+-0.04 (two runs back to back: 0.985 and 0.992), and by that spread two runs should agree within 0.05 about nine times
in ten. ``--rounds 8`` gives a quick look (+-0.09).
The tiny model is built in code unless ``--model`` names a Hugging Face directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=32)
    p.add_argument("--model", default=None, help="HF model directory (default: the tiny model built in code)")
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="leave process placement to the OS (default on CPU: vLLM's worker on all cores but the last, this "
        "process and vLLM's engine core on the last)",
    )
    return p.parse_args()


async def _raw(engine: Any, prompts: list[list[int]], args: argparse.Namespace, tag: str) -> int:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        n=args.n, temperature=1.0, max_tokens=args.max_tokens, logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY
    )

    async def one(i: int, ids: list[int]) -> int:
        final = None
        async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params, request_id=f"raw-{tag}-{i}"):
            final = out
        assert final is not None
        return sum(len(c.token_ids) for c in final.outputs)

    return sum(await asyncio.gather(*[one(i, ids) for i, ids in enumerate(prompts)]))


async def _actor(gen: Any, prompts: list[list[int]], args: argparse.Namespace) -> int:
    from async_rl.transport.protocol import GroupSampling

    sampling = GroupSampling.defaults(n=args.n, temperature=1.0, max_tokens=args.max_tokens)
    groups = await asyncio.gather(*[gen.generate(ids, sampling) for ids in prompts])
    return sum(len(c.token_ids) for g in groups for c in g)


def _pin_cpus() -> str:
    """Fix where the processes run, on a CPU-only machine with 2+ usable cores: vLLM's worker binds its OpenMP
    threads to all cores but the last (``VLLM_CPU_OMP_THREADS_BIND``), and this process, with vLLM's engine core that
    inherits its affinity, runs on the last. vLLM's own default binds the worker alike but lets the OS place the other
    two anywhere, the worker's core included. Pinned, raw vLLM ran at 6,500-7,100 tok/s (medians of two 16-round runs)
    against 5,500 unpinned (2026-12-02, 2 cores, tiny model); the rounds' spread did not narrow. Returns the layout."""
    import torch

    cpus = sorted(os.sched_getaffinity(0))
    if torch.cuda.is_available() or len(cpus) < 2 or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return "left to the OS"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cpus[:-1])
    os.sched_setaffinity(0, {cpus[-1]})
    return f"vLLM worker on CPUs {cpus[:-1]}, this process and vLLM's engine core on CPU {cpus[-1]}"


def _tree_cpu_s(proc: Any) -> float:
    """CPU seconds (user + system) used so far by ``proc`` and its live descendants (vLLM's engine core, workers)."""
    import psutil

    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


async def main(args: argparse.Namespace) -> None:
    import psutil

    from async_rl.actor.engine import GenerationEngine, actor_device
    from async_rl.config import default_config
    from async_rl.config.resolve import engine_start

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    print(f"placement: {'left to the OS' if args.no_pin else _pin_cpus()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from async_rl.models.tiny import build_tiny_model

            model = str(build_tiny_model(os.path.join(tmp, "tiny"), seed=0))
        cfg = default_config()
        rollout = cfg.actor_rollout_ref.rollout
        rollout.dtype, rollout.max_model_len, rollout.enforce_eager = "float32", args.max_tokens + 32, True
        gen = GenerationEngine(
            cfg, engine_start(cfg, model_path=model, device_type=actor_device()), extra_engine_kwargs={}
        )
        await gen.start()
        prompts = [[5 + (i % 40), 6 + (i * 7) % 40, 7 + (i * 13) % 40, 18] for i in range(args.prompts)]
        # Untimed warm-up of both paths at the full batch size (vLLM's CPU backend warms up per batch shape).
        await _raw(gen.vllm, prompts, args, "warmup")
        await _actor(gen, prompts, args)
        me = psutil.Process()
        rates: dict[str, list[float]] = {"raw": [], "actor": []}  # generated tokens per wall-clock second
        per_cpu: dict[str, list[float]] = {"raw": [], "actor": []}  # ... per CPU second of the whole process tree
        for r in range(args.rounds):
            # Each round times both paths back to back, in alternating order, and yields one paired ratio: drift on
            # a shared machine moves both sides of a pair alike, and the order does not favour either side.
            for path in ("raw", "actor") if r % 2 == 0 else ("actor", "raw"):
                c0, t0 = _tree_cpu_s(me), time.perf_counter()
                tokens = await (_raw(gen.vllm, prompts, args, str(r)) if path == "raw" else _actor(gen, prompts, args))
                rates[path].append(tokens / (time.perf_counter() - t0))
                per_cpu[path].append(tokens / max(_tree_cpu_s(me) - c0, 1e-9))
            print(
                f"round {r}: raw {rates['raw'][-1]:.0f} tok/s, actor {rates['actor'][-1]:.0f} tok/s; per CPU second "
                f"raw {per_cpu['raw'][-1]:.0f}, actor {per_cpu['actor'][-1]:.0f}",
                flush=True,
            )
        await gen.shutdown()
    from async_rl.tuning.bench import BenchLine, emit, paired_ratios

    wall = paired_ratios([a / r for a, r in zip(rates["actor"], rates["raw"], strict=True)])
    cpu = paired_ratios([a / r for a, r in zip(per_cpu["actor"], per_cpu["raw"], strict=True)])
    print(f"actor vs raw vLLM tokens per CPU second: {cpu.describe()}")
    print(f"actor vs raw vLLM generation (target >= 0.9): {wall.describe()}")
    raw, actor = statistics.median(rates["raw"]), statistics.median(rates["actor"])
    detail = (
        f"{actor:.0f} / {raw:.0f} tok/s (medians); {wall.describe()}; "
        f"per CPU second {cpu.geomean:.3f} ({cpu.ci_low:.3f}-{cpu.ci_high:.3f})"
    )
    emit("actor", [BenchLine("actor_vs_raw_vllm", wall.geomean, 0.9, detail)])


if __name__ == "__main__":
    asyncio.run(main(_parse()))
