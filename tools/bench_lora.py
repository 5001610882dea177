"""vLLM generation with a LoRA adapter against without, and this package's CPU LoRA kernels against vLLM's own.

One engine (in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor) serves the same prompts
three ways, rounds interleaved so machine noise hits all three alike: the base model (no adapter), the adapter with
vLLM 0.32's CPU torch ops, and the adapter with :mod:`async_rl.actor.lora_kernels` (what the actors install). Prints
tokens/s of each (median over rounds) and the ratios, and checks that both kernels produce the same tokens.

    python tools/bench_lora.py                      # SmolLM2-135M-Instruct, rank 16 on every linear layer
    python tools/bench_lora.py --model builtin:tiny-arith --rank 8 --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, so the kernels can be swapped
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _adapter(model_dir: str, rank: int, out: Path) -> Path:
    """A PEFT adapter on every linear layer of ``model_dir`` with random A and B (a trained-looking one)."""
    import torch
    from transformers import AutoModelForCausalLM

    from async_rl.learner.lora import apply_lora, lora_modules
    from async_rl.peft_format import LoRASpec, adapter_config, peft_name, save_adapter

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    spec = LoRASpec(rank=rank, alpha=2.0 * rank, target_modules="all-linear")
    modules = apply_lora(model, spec, seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, m in lora_modules(model):
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * 0.01)
    tensors = {str(peft_name(k)): v for k, v in model.state_dict().items() if peft_name(k) is not None}
    return save_adapter(out, tensors, adapter_config(spec, modules, base_model=model_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="16 prompts, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.rounds = 16, 2

    import vllm
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu
    from vllm.lora.request import LoRARequest

    from async_rl.actor import lora_kernels
    from async_rl.actor.engine import lora_engine_kwargs
    from async_rl.runtime.resources import resolve_model_path

    work = Path(tempfile.mkdtemp(prefix="bench_lora_"))
    model_dir = resolve_model_path(args.model, work)
    adapter = _adapter(model_dir, args.rank, work / "adapter")
    llm = vllm.LLM(
        model=model_dir, dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
        distributed_executor_backend="uni", **lora_engine_kwargs(args.rank, 2),
    )  # fmt: skip
    tok = llm.get_tokenizer()
    prompts = [
        {"prompt_token_ids": tok(f"What is {10 + i} + {37 + 2 * i}? Answer:")["input_ids"]} for i in range(args.prompts)
    ]
    params = vllm.SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    request = LoRARequest("bench", 1, str(adapter))
    originals = {name: getattr(lora_ops, name) for name in lora_kernels._NAMES}

    def use(kernels: dict[str, object]) -> None:
        for name, fn in kernels.items():
            setattr(lora_ops, name, fn)
            setattr(punica_cpu, name, fn)

    ours = {name: getattr(lora_kernels, name) for name in lora_kernels._NAMES}
    ways = {"base": (None, originals), "lora_vllm_ops": (request, originals), "lora_grouped": (request, ours)}
    llm.generate(prompts[:2], params, lora_request=request, use_tqdm=False)  # warm-up (loads the adapter)
    rates: dict[str, list[float]] = {w: [] for w in ways}
    tokens: dict[str, list[list[int]]] = {}
    for r in range(args.rounds):
        for way, (lora, kernels) in ways.items():
            use(kernels)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
            dt = time.perf_counter() - t0
            rates[way].append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
            tokens[way] = [list(o.outputs[0].token_ids) for o in outs]
            print(f"round {r + 1}: {way:>14}: {rates[way][-1]:8.1f} tok/s ({dt:.2f} s)", flush=True)
    med = {w: statistics.median(v) for w, v in rates.items()}
    same = tokens["lora_vllm_ops"] == tokens["lora_grouped"]
    print(
        f"RESULT lora_grouped/base {med['lora_grouped'] / med['base']:.2f}x, lora_vllm_ops/base "
        f"{med['lora_vllm_ops'] / med['base']:.2f}x, grouped/vllm_ops {med['lora_grouped'] / med['lora_vllm_ops']:.1f}x"
        f" (base {med['base']:.0f}, vLLM ops {med['lora_vllm_ops']:.0f}, grouped {med['lora_grouped']:.0f} tok/s;"
        f" {args.prompts} prompts x {args.max_tokens} tokens, rank {args.rank}, median of {args.rounds}); same tokens:"
        f" {same}"
    )
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
