"""Benchmark: a full weight update into a running vLLM engine versus a raw broadcast of the same bytes.

One run, one backend (``auto``: NCCL with CUDA, gloo otherwise), two processes: this process builds a Qwen2 model of
the requested size (or takes ``--model``), starts a vLLM engine with the weight-sync extension, and re-runs itself as
the *sender* (the learner stand-in, rank 0 of two groups). Each round then times, side by side (the machine's load
drifts; rounds are paired, not phases):

* raw (group epoch 0): this process receives a plain broadcast of the model's byte count cut into bucket-sized
  buffers: the best the link can do;
* update (group epoch 1): the vLLM worker receives one complete update through ``EngineWeightSync.update``
  (framing, digests, layer-wise reload into the model, load verification). By default the load verification checks
  the values of 1/N of the parameters per update in turn (``async_training.weight_sync.verify_rotation``, N = 4);
  ``--verify-rotation 1`` checks every value every time;
* reload: vLLM's own ``reload_weights`` RPC of the same weights from the local file, i.e. the cost of the load step
  alone (on CPU it dominates: every linear weight is repacked for oneDNN).

* served (with ``--engine-dtype bfloat16``, group epoch 1 again): the same update with the floating tensors cast to
  the engine's dtype before sending, as the learner does when every actor serves a narrower dtype than its fp32
  master (``weight_sync.publisher.wire_dtype``); the line ``weight_sync_served_dtype_vs_master`` is the update time
  as stored over this one.

All are timed on the receiving side; round 0 warms up. The headline ratio is (raw broadcast + vLLM's own reload) /
update, from the medians: the update should cost at most 1.2x the sum of its two parts (ratio >= 0.83). Each round's
own ratio is printed (the spread), with the worker's breakdown and the achieved-bandwidth ratio update/raw.
Example (CPU)::

    .venv/bin/python tools/bench_weight_sync.py --hidden 1024 --layers 4 --reps 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from async_rl.config.async_training import WeightSyncConfig  # noqa: E402
from async_rl.weight_sync import WeightSender, create_store, open_group  # noqa: E402

logger = logging.getLogger("bench_weight_sync")
GB = float(1 << 30)


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=["main", "sender"], default="main")
    p.add_argument(
        "--model",
        help="a Hugging Face model dir with one model.safetensors to sync instead of a built Qwen2 (e.g. the real "
        "SmolLM2: ~/.cache/async_rl/models/smollm2-135m-instruct, see tools/prepare_model.py)",
    )
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-verify", action="store_true", help="skip the load verification (to measure what it costs)")
    p.add_argument(
        "--verify-rotation",
        type=int,
        default=WeightSyncConfig().verify_rotation,
        help="values of 1/N of the parameters checked per update (async_training.weight_sync.verify_rotation; the "
        "config's default); 1 = every value on every update",
    )
    p.add_argument("--bucket-mb", type=float, default=256.0)
    p.add_argument(
        "--direct-min-mb",
        type=float,
        default=None,
        help="tensors of at least this size are sent from their own memory, not packed (WeightSender's default)",
    )
    p.add_argument(
        "--engine-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="the vLLM engine's dtype; bfloat16 also times each update sent in bf16 (what the learner sends then)",
    )
    p.add_argument("--backend", default="auto")
    p.add_argument("--timeout", type=float, default=300.0)
    return p.parse_args()


def _raw_buffers(nbytes: int, bucket: int, device: torch.device) -> list[torch.Tensor]:
    sizes = [bucket] * (nbytes // bucket) + ([nbytes % bucket] if nbytes % bucket else [])
    return [torch.ones(n, dtype=torch.uint8, device=device) for n in sizes]


def run_sender(args: argparse.Namespace) -> None:
    from safetensors.torch import load_file

    state = load_file(f"{args.model}/model.safetensors")
    weights = [(name, state[name]) for name in sorted(state)]
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    store = create_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout)
    print(f"PORT {store.port} {nbytes}", flush=True)
    opened = {
        epoch: open_group(
            "127.0.0.1", store.port, rank=0, world_size=2, epoch=epoch, backend=args.backend, timeout_s=args.timeout,
            store=store,
        )
        for epoch in (0, 1)
    }  # fmt: skip
    raw, group = opened[0], opened[1]  # epoch 0: raw broadcasts to the bench; epoch 1: updates to the vLLM worker
    bucket = int(args.bucket_mb * (1 << 20))
    buffers = _raw_buffers(nbytes, bucket, raw.device)
    weights = [(n, t.to(group.device)) for n, t in weights]
    sender = WeightSender(group, bucket_size_mb=args.bucket_mb, direct_min_mb=args.direct_min_mb)
    for version in range(args.reps + 1):  # one warm-up round, then the timed rounds: raw, then the update
        raw.broadcast(torch.zeros(1, device=raw.device), what="barrier")
        for buf in buffers:
            raw.broadcast(buf, what="raw")
        report = sender.send(weights, version=version)
        print(f"SENT {json.dumps(report.as_dict())}", flush=True)
        if args.engine_dtype != "float32":  # the same update in the engine's dtype (the publisher's wire_dtype)
            dtype = getattr(torch, args.engine_dtype)
            cast = [(n, t.to(dtype) if t.is_floating_point() else t) for n, t in weights]
            sender.send(cast, version=version)


def run_main(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm

    from async_rl.models import build_tiny_model
    from async_rl.transport.protocol import WeightSyncPlan
    from async_rl.weight_sync import EngineWeightSync, vllm_engine_kwargs
    from async_rl.weight_sync.membership import JoinInfo

    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model_dir = Path(args.model).expanduser()
        else:
            heads = max(1, args.hidden // 64)
            model_dir = build_tiny_model(
                Path(tmp) / "m",
                hidden=args.hidden,
                layers=args.layers,
                heads=heads,
                kv_heads=max(1, heads // 4),
                intermediate=4 * args.hidden,
                seed=0,
            )
        llm = vllm.LLM(
            model=str(model_dir), enforce_eager=True, dtype=args.engine_dtype, max_model_len=128, **vllm_engine_kwargs()
        )
        cmd = [
            sys.executable,
            __file__,
            "--role",
            "sender",
            "--model",
            str(model_dir),
            "--reps",
            str(args.reps),
            "--bucket-mb",
            str(args.bucket_mb),
            *(["--direct-min-mb", str(args.direct_min_mb)] if args.direct_min_mb is not None else []),
            "--engine-dtype",
            args.engine_dtype,
            "--backend",
            args.backend,
            "--timeout",
            str(args.timeout),
        ]
        sender = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert sender.stdout is not None
        _, port_s, nbytes_s = sender.stdout.readline().split()
        port, nbytes = int(port_s), int(nbytes_s)

        group = open_group("127.0.0.1", port, rank=1, world_size=2, backend=args.backend, timeout_s=args.timeout)
        buffers = _raw_buffers(nbytes, int(args.bucket_mb * (1 << 20)), group.device)
        sync = EngineWeightSync(llm, verify_rotation=args.verify_rotation)
        plan = WeightSyncPlan(
            host="127.0.0.1", port=port, backend=group.backend, timeout_s=args.timeout, join_timeout_s=args.timeout,
            version=-1, epoch=1, candidates=(),
        )  # fmt: skip
        sync.join(JoinInfo(plan=plan, world_size=2, rank_offset=1))  # a fixed group: the sender builds no roster
        # Each round times the three side by side (the machine's load drifts): a raw broadcast of the same bytes, the
        # full update, and vLLM's own in-place reload of the same weights from the local file (page cache): the cost
        # of loading alone.
        raw_times, full_times, reload_times, reports, served_times = [], [], [], [], []
        for rep in range(args.reps + 1):
            group.broadcast(torch.zeros(1, device=group.device), what="barrier")
            t0 = time.perf_counter()
            for buf in buffers:
                group.broadcast(buf, what="raw")
            t1 = time.perf_counter()
            report = sync.update(rep, verify_load=not args.no_verify)
            t2 = time.perf_counter()
            llm.collective_rpc("reload_weights", kwargs={"weights_path": str(model_dir), "is_checkpoint_format": True})
            t3 = time.perf_counter()
            if args.engine_dtype != "float32":
                sync.update(rep, verify_load=not args.no_verify)
            if rep:  # round 0 warms up
                raw_times.append(t1 - t0)
                full_times.append(t2 - t1)
                reload_times.append(t3 - t2)
                reports.append(report)
                served_times.append(time.perf_counter() - t3)
        group.close()
        sender.communicate(timeout=args.timeout)

    raw_s, full_s = statistics.median(raw_times), statistics.median(full_times)
    rounds = [round((r + lo) / f, 3) for r, f, lo in zip(raw_times, full_times, reload_times, strict=True)]
    raw_bw, full_bw = nbytes / GB / raw_s, nbytes / GB / full_s
    transfer_s = statistics.median(r["seconds"] - r["consume_seconds"] for r in reports)
    result = {
        "backend": group.backend,
        "model_mib": round(nbytes / (1 << 20), 1),
        "bucket_mb": args.bucket_mb,
        "raw_broadcast_s": round(raw_s, 4),
        "raw_gbps": round(raw_bw, 3),
        "full_update_s": round(full_s, 4),
        "full_gbps": round(full_bw, 3),
        "ratio_full_over_raw": round(full_bw / raw_bw, 3),
        "worker_receive_s": round(statistics.median(r["seconds"] for r in reports), 4),
        "worker_load_s": round(statistics.median(r["consume_seconds"] for r in reports), 4),
        "worker_transfer_excl_load_s": round(transfer_s, 4),
        "ratio_transfer_only_over_raw": round(raw_s / transfer_s, 3),
        "worker_total_s": round(statistics.median(r["total_seconds"] for r in reports), 4),
        "verify": "off" if args.no_verify else f"values of 1/{args.verify_rotation} of the parameters per update",
        "worker_verify_observe_s": round(statistics.median(r["verify_observe_seconds"] for r in reports), 4),
        "worker_verify_check_s": round(statistics.median(r["verify_check_seconds"] for r in reports), 4),
        "vllm_local_reload_s": round(statistics.median(reload_times), 4),
        "ratio_full_over_raw_plus_local_reload": round((raw_s + statistics.median(reload_times)) / full_s, 3),
        "round_ratios": rounds,
    }
    if args.engine_dtype != "float32":
        result["engine_dtype"] = args.engine_dtype
        result["served_dtype_update_s"] = round(statistics.median(served_times), 4)
        result["served_round_ratios"] = [round(f / c, 3) for f, c in zip(full_times, served_times, strict=True)]
    print(json.dumps(result, indent=2))
    parts = result["ratio_full_over_raw_plus_local_reload"]
    print(
        f"sum of parts / full update: {parts:.2f} (target >= 0.83: at most 1.2x raw broadcast + vLLM reload); "
        f"per round {min(rounds):.2f}-{max(rounds):.2f} over {len(rounds)} rounds"
    )
    from async_rl.tuning.bench import BenchLine, emit

    detail = (
        f"{result['model_mib']} MiB over {group.backend}: update {full_s:.3f} s vs raw {raw_s:.3f} s "
        f"(vLLM's own reload of the same weights {result['vllm_local_reload_s']:.3f} s); load verification: "
        f"{result['verify']}"
    )
    lines = [BenchLine("weight_sync_vs_sum_of_parts", parts, round(1 / 1.2, 2), detail)]
    if args.engine_dtype != "float32":
        served_s = result["served_dtype_update_s"]
        lines.append(
            BenchLine(
                "weight_sync_served_dtype_vs_master",
                round(full_s / served_s, 3),
                1.0,
                f"a {args.engine_dtype} engine: the update sent as stored (fp32) {full_s:.3f} s vs sent in "
                f"{args.engine_dtype} {served_s:.3f} s; per round {result['served_round_ratios']}",
            )
        )
    emit("weight_sync", lines)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    args = _parse()
    run_sender(args) if args.role == "sender" else run_main(args)


if __name__ == "__main__":
    main()
