"""Benchmark: a CPU actor's KV-cache block size, vLLM's CPU default (128) against the actor's (32), side by side.

    python tools/bench_kv_blocks.py [--model builtin:smollm2-135m-instruct] [--groups 16] [--n 8] [--max-tokens 16]
        [--rounds 6] [--dtype auto]

vLLM's prefix cache shares only full blocks. A GRPO group is ``n`` samples of one prompt: with 128-token blocks a
prompt shorter than a block is prefilled once per sample; with 32-token blocks the samples share its full blocks
(``async_rl.actor.engine.CPU_BLOCK_SIZE``). Both engines run at once, the recipe's engine settings otherwise (eager,
prefix caching on, chunked prefill off, as the actor runs them on CPU). Each round draws ``--groups`` fresh chat
prompts ("What is a + b? ..."), the recipe's task, and generates ``n`` samples of each, ``--max-tokens`` tokens
each (EOS ignored), on one engine and then the other, the order alternating by round. The line printed last is the
geometric mean of the per-round time ratios (128 / 32: above 1, the actor's blocks are faster) with its 95% interval.
Nothing is downloaded (``builtin:`` models are converted from installed wheels).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.tuning.bench import BenchLine, emit, paired_ratios  # noqa: E402

VLLM_CPU_DEFAULT_BLOCK = 128


def _prompts(tokenizer: object, start: int, count: int) -> list[str]:
    out = []
    for i in range(start, start + count):
        a, b = 10 + i % 89, 10 + (i // 89) % 89
        messages = [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore[attr-defined]
        out.append(text)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="HF directory or builtin:NAME")
    p.add_argument("--groups", type=int, default=16, help="prompts per round")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=6, help="timed rounds (one warm-up round first)")
    p.add_argument("--dtype", default="auto", help="vLLM dtype; auto: bf16 where the CPU has it, else fp32")
    args = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams

    from async_rl.actor.engine import CPU_BLOCK_SIZE
    from async_rl.config.precision import rollout_precision
    from async_rl.runtime.resources import resolve_model_path

    model = resolve_model_path(args.model, Path(tempfile.gettempdir()))
    dtype = rollout_precision(args.dtype, "cpu")[0]
    sizes = (VLLM_CPU_DEFAULT_BLOCK, CPU_BLOCK_SIZE)
    engines = {
        size: LLM(
            model=model,
            dtype=dtype,
            enforce_eager=True,
            enable_prefix_caching=True,
            enable_chunked_prefill=False,
            max_model_len=256,
            max_num_batched_tokens=max(256, args.groups * args.n * 64),
            max_num_seqs=max(256, args.groups * args.n),
            block_size=size,
            seed=0,
        )
        for size in sizes
    }
    tokenizer = engines[sizes[0]].get_tokenizer()
    sampling = SamplingParams(n=args.n, temperature=0.7, max_tokens=args.max_tokens, ignore_eos=True, logprobs=0)
    ratios: list[float] = []
    drawn = 0
    for rnd in range(args.rounds + 1):
        prompts = _prompts(tokenizer, drawn, args.groups)
        drawn += args.groups
        seconds = {}
        for size in sizes if rnd % 2 == 0 else sizes[::-1]:
            t0 = time.perf_counter()
            outs = engines[size].generate(prompts, sampling, use_tqdm=False)
            seconds[size] = time.perf_counter() - t0
            tokens = sum(len(o.token_ids) for out in outs for o in out.outputs)
            assert tokens == args.groups * args.n * args.max_tokens, tokens
        label = "warm-up" if rnd == 0 else f"round {rnd}"
        first, second = seconds[sizes[0]], seconds[sizes[1]]
        print(f"{label}: block {sizes[0]} {first:.2f} s, block {sizes[1]} {second:.2f} s", flush=True)
        if rnd:
            ratios.append(first / second)
    summary = paired_ratios(ratios)
    detail = (
        f"{args.groups} prompts x {args.n} samples x {args.max_tokens} tokens, {dtype}, {model}: time with"
        f" {sizes[0]}-token blocks / {sizes[1]}-token blocks, geomean {summary.geomean:.2f}"
        f" (95% {summary.ci_low:.2f}-{summary.ci_high:.2f}, rounds {summary.low:.2f}-{summary.high:.2f})"
    )
    print(detail)
    emit("kv_blocks", [BenchLine("actor_kv_block_32_vs_128", summary.geomean, None, detail)])


if __name__ == "__main__":
    main()
