"""Benchmark chunked per-token log-probs + entropy against the whole-matrix computation: peak memory and agreement.

Usage: ``python tools/bench_logprobs.py [--vocab 49152] [--tokens 4096] [--chunk ROWS] [--temperature 1.0]``

Both paths get the same random inputs: fp32 logits ``[tokens, vocab]`` (a leaf that requires grad) and labels. Each
runs the learner's work, forward and backward of ``sum(log_probs) + sum(entropy)`` (``entropy="grad"``), once:
``token_log_probs_and_entropy`` (chunked) and ``token_log_probs_and_entropy_reference`` (naive: the fp32
``gather - logsumexp`` and ``entropy_from_logits`` over the whole matrix, what the learner did before).

How memory is measured. Each path runs in a fresh subprocess, so neither sees the other's allocations or allocator
state. On CPU the measure is the operating system's peak resident set size, ``getrusage(RUSAGE_SELF).ru_maxrss``:
read once after a tiny warm-up run of the same path (which pages in the library code it executes) and the inputs are
allocated and written (the baseline), and once after the backward pass. PyTorch's CPU allocator has no cache, and
the subprocess runs with ``MALLOC_MMAP_THRESHOLD_=1 MiB`` so glibc maps every buffer of 1 MiB or more on its own and
unmaps it on free (by default its threshold adapts up to 32 MiB and freed heap memory may stay resident); the peak
RSS is then the most memory the pass held at any instant. (``tracemalloc`` does not see torch's allocations.) On
CUDA the measure is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.

What is counted: ``peak - baseline - bytes(logits.grad)``. The baseline already holds the input logits and labels;
the gradient of the logits is one ``[tokens, vocab]`` tensor both paths must produce, so it is taken out too. What
remains is each path's working memory: fp32 copies, softmax temporaries, what autograd saves, the per-row outputs.
The chunked path allocates its gradient before its backward's chunks run, so the subtraction is exact for it; if the
naive path peaks before its gradient exists, the subtraction undercounts it, which only makes the ratio harder to
reach. The ratio reported is naive / chunked (target >= 4: chunked at most a quarter of naive).

Agreement. Each subprocess saves its log-probs, entropy and gradient; this process prints their largest absolute
difference, and each path's largest error against the same reference computed in fp64 (256 rows at a time). The
target (``1e-5 / error >= 1``) is on the chunked path's error against fp64: at large vocabularies the naive fp32 path
is itself off by more than 1e-5 (its entropy ``logsumexp(z) - sum(p z)`` cancels), so the chunked - naive
difference measures mostly the naive path's rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from async_rl.algorithms import (  # noqa: E402
    default_chunk_rows,
    token_log_probs_and_entropy,
    token_log_probs_and_entropy_reference,
)
from async_rl.tuning.bench import BenchLine, emit  # noqa: E402

PATHS = ("chunked", "naive")
TOLERANCE = 1e-5
MEMORY_TARGET = 4.0  # naive / chunked working memory


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def make_inputs(args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The benchmark's logits ``[tokens, vocab]`` (fp32, 3 * N(0, 1)) and labels, the same in every process."""
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(args.tokens, args.vocab, generator=gen, device=device).mul_(3.0)
    labels = torch.randint(0, args.vocab, (args.tokens,), generator=gen, device=device)
    return logits, labels


def forward_backward(path: str, logits: torch.Tensor, labels: torch.Tensor, args: argparse.Namespace) -> torch.Tensor:
    """Log-probs and entropy by ``path``, then backward of their sum; returns ``[2, tokens]`` (log-probs, entropy)."""
    kw: dict[str, Any] = {"temperature": args.temperature, "entropy": "grad"}
    if path == "chunked":
        lp, ent = token_log_probs_and_entropy(logits, labels, chunk_size=args.chunk, **kw)
    else:
        lp, ent = token_log_probs_and_entropy_reference(logits, labels, **kw)
    assert ent is not None
    (lp.sum() + ent.sum()).backward()
    return torch.stack([lp.detach(), ent.detach()])


def worker(args: argparse.Namespace) -> None:
    """One path in this fresh process: print its measured working memory and save its outputs to ``args.save``."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # warm-up on a tiny input: the first run pages in library code and lazy imports, which RSS would count
    tiny_logits, tiny_labels = torch.randn(4, 64, device=device, requires_grad=True), torch.zeros(4, dtype=torch.long)
    forward_backward(args.worker, tiny_logits, tiny_labels.to(device), argparse.Namespace(**{**vars(args), "chunk": 2}))
    logits, labels = make_inputs(args, device)
    logits.requires_grad_(True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    baseline = _peak_bytes(device) if device.type == "cpu" else int(torch.cuda.memory_allocated(device))
    started = time.perf_counter()
    values = forward_backward(args.worker, logits, labels, args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    peak = _peak_bytes(device)
    assert logits.grad is not None
    grad_bytes = logits.grad.numel() * logits.grad.element_size()
    result = {"path": args.worker, "extra_bytes": peak - baseline - grad_bytes, "grad_bytes": grad_bytes}
    result |= {"baseline_bytes": baseline, "peak_bytes": peak, "seconds": seconds}
    tensors = {"lp": values[0].cpu(), "ent": values[1].cpu(), "grad": logits.grad.cpu()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, args.save)  # safetensors: no pickle
    print("WORKER_RESULT " + json.dumps(result), flush=True)


def run_path(path: str, args: argparse.Namespace, save: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", path, "--save", str(save)]
    cmd += ["--vocab", str(args.vocab), "--tokens", str(args.tokens), "--chunk", str(args.chunk)]
    cmd += ["--temperature", str(args.temperature), "--device", args.device, "--threads", str(args.threads)]
    # a fixed glibc mmap threshold: every buffer of 1 MiB and more is mmap-ed and unmapped on free, so the RSS tracks
    # the live tensors instead of heap memory glibc keeps after a free (its default threshold adapts up to 32 MiB)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    line = next(raw for raw in reversed(out.splitlines()) if raw.startswith("WORKER_RESULT "))
    return dict(json.loads(line[len("WORKER_RESULT ") :]))


KEYS = ("lp", "ent", "grad")


def max_abs_diffs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    return {key: float((a[key].double() - b[key].double()).abs().max()) for key in KEYS}


def fp64_errors(outputs: dict[str, dict[str, torch.Tensor]], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Each path's largest abs error against the reference computed in fp64 on the same inputs, 256 rows at a time.

    The loss is a sum over rows, so each block's fp64 gradient is exactly that block of the full gradient.
    """
    device = torch.device(args.device)
    logits, labels = make_inputs(args, device)
    errors = {path: dict.fromkeys(KEYS, 0.0) for path in outputs}
    for start in range(0, args.tokens, 256):
        rows = slice(start, start + 256)
        block = logits[rows].double().requires_grad_(True)
        exact = forward_backward("naive", block, labels[rows], args)
        assert block.grad is not None
        want = {"lp": exact[0].cpu(), "ent": exact[1].cpu(), "grad": block.grad.cpu()}
        for path, got in outputs.items():
            diffs = max_abs_diffs({key: got[key][rows] for key in KEYS}, want)
            errors[path] = {key: max(errors[path][key], diffs[key]) for key in KEYS}
    return errors


def _fmt(diffs: dict[str, float]) -> str:
    return f"log-prob {diffs['lp']:.1e}  entropy {diffs['ent']:.1e}  grad {diffs['grad']:.1e}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=49_152)
    p.add_argument("--tokens", type=int, default=4_096)
    p.add_argument("--chunk", type=int, default=None, help="rows per chunk (chunked path); default: 32 MiB of fp32")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per path (CPU)")
    p.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.chunk is None:
        args.chunk = default_chunk_rows(args.vocab)
    for key in ("vocab", "tokens", "chunk", "threads"):
        if getattr(args, key) < 1:
            raise ValueError(f"--{key} must be >= 1, got {getattr(args, key)}")
    if args.worker:
        worker(args)
        return
    results: dict[str, dict[str, Any]] = {}
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in PATHS:
            save = Path(tmp) / f"{path}.safetensors"
            results[path] = run_path(path, args, save)
            outputs[path] = load_file(save)
            save.unlink()
    diffs = max_abs_diffs(outputs["chunked"], outputs["naive"])
    errors = fp64_errors(outputs, args)
    chunked, naive = results["chunked"]["extra_bytes"], results["naive"]["extra_bytes"]
    mib = 2**20
    method = "peak RSS (ru_maxrss)" if args.device == "cpu" else "torch.cuda.max_memory_allocated"
    print(f"== log-probs + entropy, forward + backward: {args.tokens} tokens x {args.vocab} vocab, fp32 logits ==")
    print(f"device {args.device}; memory: {method} in a fresh process per path, minus the inputs and logits.grad")
    print(f"input logits {results['naive']['grad_bytes'] / mib:.0f} MiB; their grad the same (both not counted)")
    for path in PATHS:
        r = results[path]
        label = f"{path} (chunk {args.chunk})" if path == "chunked" else path
        print(f"{label:18s} working memory {r['extra_bytes'] / mib:8.0f} MiB   time {r['seconds']:.2f} s")
    print(f"chunked / naive working memory: {chunked / max(naive, 1):.3f} (target <= {1 / MEMORY_TARGET:.2f})")
    print(f"{'max |chunked - naive|':24s} {_fmt(diffs)}")
    for path in PATHS:
        print(f"{f'max |{path} - fp64|':24s} {_fmt(errors[path])}")
    worst = max(errors["chunked"].values())
    lines = [
        BenchLine(
            "logprobs_naive_vs_chunked_mem",
            naive / max(chunked, 1),
            MEMORY_TARGET,
            f"{naive / mib:.0f} / {chunked / mib:.0f} MiB at {args.tokens}x{args.vocab}, chunk {args.chunk}",
        ),
        BenchLine(
            "logprobs_tolerance_vs_error",
            TOLERANCE / max(worst, 1e-12),
            1.0,
            f"chunked max abs error vs fp64 {worst:.1e} (tolerance {TOLERANCE:.0e}); "
            f"vs naive fp32 {max(diffs.values()):.1e}; naive vs fp64 {max(errors['naive'].values()):.1e}",
        ),
    ]
    emit("logprobs", lines)


if __name__ == "__main__":
    main()
