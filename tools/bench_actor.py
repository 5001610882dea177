"""Benchmark: the actor's generation engine vs raw vLLM on the same prompts, sampling and engine, in one run.

    python tools/bench_actor.py [--prompts 256] [--n 4] [--max-tokens 64] [--rounds 5] [--model DIR]

Both sides use one ``AsyncLLM`` (so start-up, weights and KV cache are shared): "raw" submits every prompt with
``AsyncLLM.generate`` (``n`` completions, per-token log-probs, final output only); "actor" submits the same prompts
through :class:`async_rl.actor.engine.GenerationEngine` (final outputs too, behaviour log-probs, version spans,
prefix cache salted by version). Each round times both, back to back in alternating order, and gives one paired ratio of
generated tokens/s, and one of tokens per CPU second of the whole process tree (vLLM's engine core included); the
line printed last is the median paired ratio (target >= 0.9) with its spread. The default rounds are long (256
prompts x 4 = 1,024 sequences in flight, ~18 s a side here): with 64 prompts (~4.5 s a side) the paired ratios of one
run spread 0.75-1.41 and two runs' medians differed by 0.08, while CPU time tracked wall time (the machine runs slower
at times, it does not take the cores away). The tiny model is built in code unless ``--model`` names a Hugging Face
directory.
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
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model", default=None, help="HF model directory (default: the tiny model built in code)")
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

    from async_rl.actor.engine import EngineSettings, GenerationEngine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from async_rl.models.tiny import build_tiny_model

            model = str(build_tiny_model(os.path.join(tmp, "tiny"), seed=0))
        gen = GenerationEngine(
            EngineSettings.defaults(
                model_path=model, dtype="float32", max_model_len=args.max_tokens + 32, enforce_eager=True
            )
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
    raw_rates, actor_rates = rates["raw"], rates["actor"]
    cpu_ratios = sorted(a / r for a, r in zip(per_cpu["actor"], per_cpu["raw"], strict=True))
    cpu_ratio = statistics.median(cpu_ratios)
    print(
        f"actor vs raw vLLM tokens per CPU second: median paired ratio {cpu_ratio:.2f}; "
        f"paired ratios {cpu_ratios[0]:.2f}-{cpu_ratios[-1]:.2f}"
    )
    ratios = sorted(a / r for a, r in zip(actor_rates, raw_rates, strict=True))
    ratio = statistics.median(ratios)
    raw, actor = statistics.median(raw_rates), statistics.median(actor_rates)
    q1, q3 = (statistics.quantiles(ratios, n=4)[i] for i in (0, 2)) if len(ratios) >= 2 else (ratio, ratio)
    spread = f"paired ratios {ratios[0]:.2f}-{ratios[-1]:.2f}, middle half {q1:.2f}-{q3:.2f}"
    print(f"actor vs raw vLLM generation: median paired ratio {ratio:.2f} (target >= 0.9); {spread}")
    from async_rl.tuning.bench import BenchLine, emit

    detail = (
        f"{actor:.0f} / {raw:.0f} tok/s (medians), median of {args.rounds} paired rounds; {spread}; "
        f"per CPU second {cpu_ratio:.2f} ({cpu_ratios[0]:.2f}-{cpu_ratios[-1]:.2f})"
    )
    emit("actor", [BenchLine("actor_vs_raw_vllm", ratio, 0.9, detail)])


if __name__ == "__main__":
    asyncio.run(main(_parse()))
