"""Learner stand-in for the vLLM weight-sync tests: a separate process that broadcasts (perturbed) weights.

Run as a script: it hosts the TCPStore on a free port, prints ``PORT <n>`` on stdout, joins the weight-sync group as
rank 0 and performs one update in the requested mode, then prints ``REPORT <json>`` (or ``ERROR <text>``). Imported as
a module (by file path), it provides :func:`perturbed_weights`, so the test can rebuild exactly the weights sent.

Modes: ``lora`` sends LoRA adapters of rank ``--lora-rank`` (:func:`lora_model` builds them) under PEFT's names,
one update per version of ``--versions`` (each drawn from its version as the seed);
``good`` sends every tensor; ``corrupt_digest`` sends every tensor but digests different bytes for one;
``skip`` leaves one tensor out of the update; ``hang`` joins the group and sends nothing for ``--hang-s`` seconds, then
(with ``--then-good``) rejoins under epoch + 1 and sends a good update.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def perturbed_weights(model_dir: str, seed: int, scale: float) -> dict[str, torch.Tensor]:
    """The checkpoint's weights plus N(0, scale) noise drawn from ``seed``, in name order (deterministic, HF names)."""
    from safetensors.torch import load_file

    state = load_file(f"{model_dir}/model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    return {name: state[name] + torch.randn(state[name].shape, generator=gen) * scale for name in sorted(state)}


def lora_model(model_dir: str, seed: int, rank: int) -> torch.nn.Module:
    """The checkpoint with an all-linear LoRA adapter (alpha = 2 x rank) whose A and B are drawn from ``seed``."""
    from transformers import AutoModelForCausalLM

    from async_rl.learner.lora import apply_lora, lora_modules
    from async_rl.peft_format import LoRASpec

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_lora(model, LoRASpec(rank=rank, alpha=2.0 * rank, target_modules="all-linear"), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, module in lora_modules(model):
            module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=gen) * 0.05)
    return model.eval()


def lora_weights(model_dir: str, seed: int, rank: int) -> dict[str, torch.Tensor]:
    """What mode ``lora`` sends: the adapter of :func:`lora_model` under PEFT's names."""
    from async_rl.peft_format import peft_name

    state = lora_model(model_dir, seed, rank).state_dict()
    return {str(peft_name(k)): v for k, v in state.items() if peft_name(k) is not None}


def main() -> None:
    from async_rl.weight_sync.digest import ByteDigest
    from async_rl.weight_sync.group import create_store, open_group
    from async_rl.weight_sync.protocol import ChunkMeta
    from async_rl.weight_sync.sender import WeightSender

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--mode", choices=["good", "corrupt_digest", "skip", "hang", "lora"], required=True)
    parser.add_argument("--target", default="model.layers.1.self_attn.k_proj.weight")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--bucket-mb", type=float, default=0.25)
    parser.add_argument("--hang-s", type=float, default=30.0)
    parser.add_argument("--then-good", action="store_true")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--versions", default="1")
    args = parser.parse_args()

    weights = {} if args.mode == "lora" else perturbed_weights(args.model, args.seed, args.scale)
    store = create_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout)
    print(f"PORT {store.port}", flush=True)
    group = open_group(
        "127.0.0.1",
        store.port,
        rank=0,
        world_size=args.world_size,
        epoch=args.epoch,
        backend="auto",
        timeout_s=args.timeout,
        store=store,
    )
    if args.mode == "hang":
        time.sleep(args.hang_s)
        if not args.then_good:
            print("REPORT {}", flush=True)
            return
        group.rejoin(args.epoch + 1)
        args.mode = "good"

    class CorruptingSender(WeightSender):
        def _digest_chunk(self, meta: ChunkMeta, data: torch.Tensor, state: ByteDigest) -> None:
            # Digest other bytes than the ones sent, for one tensor.
            if meta.name == args.target:
                data = data.clone()
                data[0] ^= 1
            super()._digest_chunk(meta, data, state)

    if args.mode == "lora":
        sender = WeightSender(group, bucket_size_mb=args.bucket_mb)
        for version in [int(v) for v in args.versions.split(",")]:
            report = sender.send(list(lora_weights(args.model, version, args.lora_rank).items()), version=version)
            print(f"REPORT {json.dumps(report.as_dict())}", flush=True)
        return
    sender_cls = CorruptingSender if args.mode == "corrupt_digest" else WeightSender
    items = [(k, v) for k, v in weights.items() if not (args.mode == "skip" and k == args.target)]
    try:
        report = sender_cls(group, bucket_size_mb=args.bucket_mb).send(items, version=args.version)
    except Exception as exc:  # report to the test instead of dying silently
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        sys.exit(1)
    print(f"REPORT {json.dumps(report.as_dict())}", flush=True)


if __name__ == "__main__":
    main()
