"""Benchmark: a CPU actor's vLLM engine settings against vLLM's CPU defaults, one at a time, side by side.

    python tools/bench_cpu_engine.py [--model builtin:smollm2-135m-instruct] [--groups 16] [--n 8] [--max-tokens 16]
        [--rounds 6] [--dtype auto]

Five engines run at once, the recipe's engine settings otherwise (eager, prefix caching on, chunked prefill off,
processed log-probs, as the actor runs them on CPU), each adding one of the actor's settings to the one before:

* ``default``: vLLM's CPU defaults: 128-token KV blocks, torch RMSNorm;
* ``blocks``: 32-token blocks (``async_rl.actor.engine.CPU_BLOCK_SIZE``). vLLM's prefix cache shares only full
  blocks, and a GRPO group is ``n`` samples of one prompt: with 128-token blocks a prompt shorter than a block is
  prefilled once per sample; with 32-token blocks the samples share its full blocks;
* ``kernels``: 32-token blocks and vLLM's C++ RMSNorm kernels put first (``async_rl.actor.cpu_kernels``), loaded as
  the actor loads them, through its weight-sync worker extension, with vLLM's Gumbel-max sampler;
* ``tails``: all of the above and the scheduler that has one sample of a group compute the prompt's partly filled
  last block and the others copy it (``async_rl.actor.prompt_tails``): the actor as it runs;
* ``sampler``: all of the above and the opt-in inverse-CDF sampler (``async_rl.actor.cpu_sampler``,
  ``ASYNC_RL_CPU_SAMPLER=inverse_cdf`` in its processes).

Each round draws ``--groups`` fresh chat prompts ("What is a + b? ..."), the recipe's task, and generates ``n``
samples of each, ``--max-tokens`` tokens each (EOS ignored), on every engine, the order rotating by round. The last
lines are the geometric means of the per-round time ratios with their 95% intervals: ``actor_kv_block_32_vs_128``
(default / blocks), ``actor_rmsnorm_kernel_vs_torch`` (blocks / kernels), ``actor_prompt_tail_copy_vs_prefill``
(kernels / tails) and ``actor_cpu_sampler_vs_gumbel`` (tails / sampler); above 1, the later setting is faster.
Nothing is downloaded (``builtin:`` models are converted from installed wheels).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.tuning.bench import BenchLine, emit, paired_ratios  # noqa: E402

VLLM_CPU_DEFAULT_BLOCK = 128


def recipe_prompts(tokenizer: object, start: int, count: int) -> list[str]:
    """``count`` of the recipe's chat prompts (\"What is a + b? ...\"), the ``start``-th on, with the chat template."""
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

    from async_rl.actor import cpu_kernels, cpu_sampler
    from async_rl.actor.engine import CPU_BLOCK_SIZE, PROMPT_TAIL_SCHEDULER
    from async_rl.config.precision import rollout_precision
    from async_rl.runtime.resources import resolve_model_path
    from async_rl.weight_sync.client import vllm_engine_kwargs

    model = resolve_model_path(args.model, Path(tempfile.gettempdir()))
    dtype = rollout_precision(args.dtype, "cpu")[0]
    cpu_kernels.register()
    settings: dict[str, dict[str, Any]] = {
        "default": {"block_size": VLLM_CPU_DEFAULT_BLOCK},
        "blocks": {"block_size": CPU_BLOCK_SIZE},
        "kernels": {"block_size": CPU_BLOCK_SIZE, "ir_op_priority": cpu_kernels.IR_OP_PRIORITY, **vllm_engine_kwargs()},
    }
    settings["tails"] = {**settings["kernels"], "scheduler_cls": PROMPT_TAIL_SCHEDULER}
    settings["sampler"] = settings["tails"]
    engines = {}
    for name, extra in settings.items():
        if name == "sampler":  # its processes put the inverse-CDF sampler in (they read the variable when they start)
            os.environ[cpu_sampler.ENV] = "inverse_cdf"
        else:
            os.environ.pop(cpu_sampler.ENV, None)
        engines[name] = LLM(
            model=model,
            dtype=dtype,
            enforce_eager=True,
            enable_prefix_caching=True,
            enable_chunked_prefill=False,
            logprobs_mode="processed_logprobs",  # the actor's default (async_training.actor.logprobs_mode)
            max_model_len=256,
            max_num_batched_tokens=max(256, args.groups * args.n * 64),
            max_num_seqs=max(256, args.groups * args.n),
            seed=0,
            **extra,
        )
    os.environ.pop(cpu_sampler.ENV, None)
    for name in ("kernels", "tails", "sampler"):
        state = engines[name].collective_rpc("cpu_sampler_state")[0]
        if state["in_use"] != (name == "sampler"):
            raise SystemExit(f"engine {name!r}: the inverse-CDF sampler in use: {state['in_use']}, expected otherwise")
    names = list(engines)
    tokenizer = engines[names[0]].get_tokenizer()
    sampling = SamplingParams(n=args.n, temperature=0.7, max_tokens=args.max_tokens, ignore_eos=True, logprobs=0)
    pairs = {
        "actor_kv_block_32_vs_128": ("default", "blocks"),
        "actor_rmsnorm_kernel_vs_torch": ("blocks", "kernels"),
        "actor_prompt_tail_copy_vs_prefill": ("kernels", "tails"),
        "actor_cpu_sampler_vs_gumbel": ("tails", "sampler"),
    }
    ratios: dict[str, list[float]] = {line: [] for line in pairs}
    drawn = 0
    for rnd in range(args.rounds + 1):
        prompts = recipe_prompts(tokenizer, drawn, args.groups)
        drawn += args.groups
        seconds = {}
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            t0 = time.perf_counter()
            outs = engines[name].generate(prompts, sampling, use_tqdm=False)
            seconds[name] = time.perf_counter() - t0
            tokens = sum(len(o.token_ids) for out in outs for o in out.outputs)
            assert tokens == args.groups * args.n * args.max_tokens, tokens
        label = "warm-up" if rnd == 0 else f"round {rnd}"
        print(f"{label}: " + ", ".join(f"{name} {seconds[name]:.2f} s" for name in names), flush=True)
        if rnd:
            for line, (slow, fast) in pairs.items():
                ratios[line].append(seconds[slow] / seconds[fast])
    lines = []
    for line, (slow, fast) in pairs.items():
        summary = paired_ratios(ratios[line])
        detail = (
            f"{args.groups} prompts x {args.n} samples x {args.max_tokens} tokens, {dtype}, {model}: time {slow} /"
            f" {fast}, geomean {summary.geomean:.2f} (95% {summary.ci_low:.2f}-{summary.ci_high:.2f}, rounds"
            f" {summary.low:.2f}-{summary.high:.2f})"
        )
        print(f"{line}: {detail}")
        lines.append(BenchLine(line, summary.geomean, None, detail))
    emit("cpu_engine", lines)


if __name__ == "__main__":
    main()
