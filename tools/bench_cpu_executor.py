"""Benchmark: a CPU actor's vLLM process layout, side by side. Three layouts: the model in the engine-core process
forked from the actor's (``fork``, what the actor runs, ``async_rl/actor/vllm_launch.py``), the same spawned (``uni``,
vLLM's start method on CPU), and vLLM's own layout (``mp``: a separate worker process, spawned too).

    python tools/bench_cpu_executor.py [--model builtin:smollm2-135m-instruct] [--groups 16] [--n 8]
        [--max-tokens 16] [--rounds 4] [--pairs 2] [--beside 1]

Each layout runs in a fresh process, the three in turn for ``--pairs`` rounds (each round starts one layout later).
A process builds the actor's engine arguments for the recipe's task (32-token KV blocks, vLLM's C++ RMSNorm kernels,
processed log-probs, bf16 where the CPU has it), starts the engine, runs one warm-up round and ``--rounds`` timed
rounds of ``--groups`` chat prompts x ``--n`` samples x ``--max-tokens`` tokens (EOS ignored). While it generates,
``--beside`` one-thread bf16 matmul processes run next to it, standing in for a learner sharing the cores; their rate
is the CPU the engine leaves to others. The last lines are geometric means over the rounds, above 1 when the second
layout named is better: ``actor_cpu_engine_start_mp_vs_uni`` and ``actor_cpu_engine_start_spawn_vs_fork`` (start-up
time, process start to engine up), ``actor_cpu_generation_mp_vs_uni`` and ``actor_cpu_generation_spawn_vs_fork``
(median round time), ``actor_cpu_beside_matmul_uni_vs_mp`` and ``actor_cpu_beside_matmul_fork_vs_spawn`` (matmul
rate, first over second). Nothing is downloaded (``builtin:`` models are converted from installed wheels).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_cpu_engine import recipe_prompts  # noqa: E402  (tools/ is this script's sys.path[0])

from async_rl.tuning.bench import BenchLine, emit, paired_ratios  # noqa: E402

LAYOUTS = ("mp", "uni", "fork")
PAIRS = (("mp", "uni"), ("uni", "fork"))  # (before, after): vLLM's layout against the model in the engine core,
# then that engine core spawned against forked
NAMES = {
    "start_uni": "actor_cpu_engine_start_mp_vs_uni",
    "generation_uni": "actor_cpu_generation_mp_vs_uni",
    "matmul_uni": "actor_cpu_beside_matmul_uni_vs_mp",
    "start_fork": "actor_cpu_engine_start_spawn_vs_fork",
    "generation_fork": "actor_cpu_generation_spawn_vs_fork",
    "matmul_fork": "actor_cpu_beside_matmul_fork_vs_spawn",
}
MATMUL = """
import sys, time, torch
torch.set_num_threads(1)
a, b = torch.randn(1024, 576, dtype=torch.bfloat16), torch.randn(576, 1536, dtype=torch.bfloat16)
n, t0 = 0, time.perf_counter()
while True:
    a @ b
    n += 1
    if n % 20 == 0 and sys.stdin in __import__('select').select([sys.stdin], [], [], 0)[0]:
        break
print(n / (time.perf_counter() - t0), flush=True)
"""


async def _child(args: argparse.Namespace, started: float) -> None:
    """One layout in this process: start the engine, generate, and print a JSON line of the timings."""
    import vllm
    from vllm.sampling_params import RequestOutputKind

    from async_rl.actor.engine import engine_args
    from async_rl.actor.vllm_launch import keep_torch_single_threaded, start_async_llm
    from async_rl.config import default_config
    from async_rl.config.precision import rollout_precision
    from async_rl.config.resolve import EngineStart
    from async_rl.runtime.resources import resolve_model_path
    from async_rl.weight_sync.client import EXTENSION_CLS

    if args.child == "fork":
        keep_torch_single_threaded()  # as the actor's process
    model = resolve_model_path(args.model, Path(tempfile.gettempdir()))
    rollout = default_config().actor_rollout_ref.rollout
    rollout.max_num_seqs, rollout.enforce_eager = args.groups * args.n, True
    start = EngineStart(model_path=model, dtype=rollout_precision(args.dtype, "cpu")[0], max_loras=1)
    eargs = engine_args(
        rollout,
        start,
        max_model_len=256,
        gpu_memory_utilization=0.5,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        seed=0,
        worker_extension_cls=EXTENSION_CLS,
    )
    if args.child == "mp":
        eargs.distributed_executor_backend = "mp"  # what engine_kwargs.vllm does: vLLM's layout, through the same call
    llm = start_async_llm(eargs, on_cpu=True)
    up = time.time() - started
    tokenizer = llm.get_tokenizer()
    if asyncio.iscoroutine(tokenizer):
        tokenizer = await tokenizer
    params = vllm.SamplingParams(
        n=args.n,
        temperature=0.7,
        max_tokens=args.max_tokens,
        ignore_eos=True,
        logprobs=0,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )

    async def one(engine: Any, prompt: str, rid: str) -> int:
        final = None
        async for out in engine.generate(prompt, params, request_id=rid):
            final = out
        assert final is not None
        return sum(len(c.token_ids) for c in final.outputs)

    seconds = []
    for rnd in range(args.rounds + 1):
        if rnd == 1:
            print("GENERATING", flush=True)  # the parent starts the matmul processes
        t0 = time.perf_counter()
        prompts = recipe_prompts(tokenizer, rnd * args.groups, args.groups)
        tokens = await asyncio.gather(*[one(llm, p, f"{rnd}-{i}") for i, p in enumerate(prompts)])
        if rnd:
            seconds.append(time.perf_counter() - t0)
        assert sum(tokens) == args.groups * args.n * args.max_tokens, tokens
    print(json.dumps({"start_s": up, "round_s": seconds}), flush=True)
    llm.shutdown()
    del llm  # now, while the interpreter is whole (its __del__ would shut it down again at exit)


def _run(args: argparse.Namespace, layout: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", layout, *sys.argv[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BENCH_STARTED": repr(time.time())}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    matmuls: list[subprocess.Popen[str]] = []
    result: dict[str, Any] = {}
    for line in proc.stdout:
        if line.startswith("GENERATING"):
            matmuls = [
                subprocess.Popen(
                    [sys.executable, "-c", MATMUL], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
                for _ in range(args.beside)
            ]
        elif line.startswith("{"):
            result = json.loads(line)
            rates = []
            for m in matmuls:
                out, _ = m.communicate("stop\n")
                rates.append(float(out))
            result["matmul_per_s"] = sum(rates)
    if proc.wait() != 0 or not result:
        raise SystemExit(f"the {layout} engine failed (exit {proc.returncode})")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="HF directory or builtin:NAME")
    p.add_argument("--groups", type=int, default=16, help="prompts per round")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=4, help="timed rounds per engine (one warm-up round first)")
    p.add_argument("--pairs", type=int, default=2, help="engines started per layout, in turn")
    p.add_argument("--beside", type=int, default=1, help="one-thread matmul processes running beside generation")
    p.add_argument("--dtype", default="auto", help="vLLM dtype; auto: bf16 where the CPU has it, else fp32")
    p.add_argument("--child", choices=LAYOUTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.child:
        asyncio.run(_child(args, started=float(os.environ["BENCH_STARTED"])))
        return
    ratios: dict[str, list[float]] = {key: [] for key in NAMES}
    for pair in range(args.pairs):
        runs = {}
        for layout in LAYOUTS[pair % 3 :] + LAYOUTS[: pair % 3]:
            runs[layout] = _run(args, layout)
            r = runs[layout]
            print(
                f"pair {pair + 1} {layout}: start {r['start_s']:.1f} s, rounds "
                + ", ".join(f"{s:.2f}" for s in r["round_s"])
                + f" s, matmul beside {r['matmul_per_s']:.0f}/s",
                flush=True,
            )
        for (slow, fast), kind in zip(PAIRS, ("uni", "fork"), strict=True):
            a, b = runs[slow], runs[fast]
            ratios[f"start_{kind}"].append(a["start_s"] / b["start_s"])
            ratios[f"generation_{kind}"].append(statistics.median(a["round_s"]) / statistics.median(b["round_s"]))
            if args.beside:
                ratios[f"matmul_{kind}"].append(b["matmul_per_s"] / a["matmul_per_s"])
    lines = []
    for key, values in ratios.items():
        if not values:
            continue
        s = paired_ratios(values)
        detail = (
            f"{args.groups} prompts x {args.n} samples x {args.max_tokens} tokens, {args.beside} matmul process(es)"
            f" beside, {args.pairs} pairs: geomean {s.geomean:.2f} (pairs {s.low:.2f}-{s.high:.2f})"
        )
        print(f"{NAMES[key]}: {detail}")
        lines.append(BenchLine(NAMES[key], s.geomean, None, detail))
    emit("cpu_executor", lines)


if __name__ == "__main__":
    main()
