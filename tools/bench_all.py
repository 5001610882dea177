"""Every benchmark in one command: one line per measured ratio, all measured in this run.

    python tools/bench_all.py [--quick] [--only actor transport ...] [--out outputs/bench]

Each benchmark runs in its own process, one after another (they would steal each other's cores otherwise), with its
output kept in ``<out>/<name>.log``. Each prints a ``BENCH_RESULT`` line last (``async_rl.tuning.bench``); this
collects them into one table on stdout and ``<out>/results.json``. A benchmark that fails or times out is reported
as such with its log path; the others still run. Exit status: 0 when every benchmark produced its result, 1 otherwise
(a ratio below its target is reported, not an error: these are measurements, not tests).

The benchmarks (each compares with a reference measured side by side in the same process tree):

=============  ==========================================================================================
actor          the actor's generation engine vs raw vLLM on the same prompts (tools/bench_actor.py)
cpu_engine     a CPU actor's engine settings vs vLLM's CPU defaults: 32-token KV blocks, RMSNorm kernels
               (tools/bench_cpu_engine.py)
cpu_executor   a CPU actor's vLLM process layout (the model in the engine-core process) vs vLLM's (a worker
               process): start-up, generation, a matmul beside it (tools/bench_cpu_executor.py)
transport      rollout plane vs raw pyzmq on the same bytes (tools/bench_transport.py)
weight_sync    a full weight update into vLLM vs a raw broadcast of the same bytes (tools/bench_weight_sync.py)
learner        packed vs padded micro-batches; FSDP2 2 ranks vs 1 (tools/bench_learner.py)
pipeline       end-to-end vs ideal with rate-emulating actors; async (K >= 1) vs sync (K = 0)
               (tools/bench_pipeline.py)
logprobs       chunked log-probs + entropy (forward + backward) vs the whole-matrix fp32 computation: peak
               memory, and error against fp64 (tools/bench_logprobs.py)
=============  ==========================================================================================
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from async_rl.tuning.bench import BenchLine, format_line, parse  # noqa: E402

# name -> (script, full-run arguments, --quick arguments, timeout seconds)
BENCHMARKS: dict[str, tuple[str, list[str], list[str], float]] = {
    "actor": ("bench_actor.py", [], ["--prompts", "32", "--rounds", "6"], 900),
    "cpu_engine": ("bench_cpu_engine.py", [], ["--groups", "8", "--rounds", "3"], 900),
    "cpu_executor": ("bench_cpu_executor.py", [], ["--groups", "8", "--rounds", "2", "--pairs", "1"], 900),
    "transport": ("bench_transport.py", [], ["--groups", "2000", "--repeats", "1"], 900),
    "weight_sync": ("bench_weight_sync.py", [], ["--hidden", "512", "--layers", "2", "--reps", "2"], 900),
    "learner": ("bench_learner.py", [], ["--steps", "2"], 900),
    "pipeline": ("bench_pipeline.py", [], ["--quick"], 1500),
    "logprobs": ("bench_logprobs.py", [], ["--vocab", "32768", "--tokens", "2048", "--chunk", "256"], 900),
}


def run_one(name: str, quick: bool, out_dir: Path) -> tuple[str, list[BenchLine], float]:
    """Run benchmark ``name``; returns (status, its result lines, seconds). Status is 'ok', 'failed' or 'timeout'."""
    script, full, fast, timeout_s = BENCHMARKS[name]
    cmd = [sys.executable, str(REPO / "tools" / script), *(fast if quick else full)]
    log = out_dir / f"{name}.log"
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return "timeout", [], time.monotonic() - started
    parsed = parse(log.read_text(errors="replace"))
    seconds = time.monotonic() - started
    if code != 0 or parsed is None:
        return "failed", parsed[1] if parsed else [], seconds
    return "ok", parsed[1], seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds (a few minutes in all)")
    p.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these benchmarks")
    p.add_argument("--out", default="outputs/bench", help="directory for the logs and results.json")
    args = p.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, dict[str, object]] = {}
    table: list[str] = []
    all_ok = True
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} ... ", end="", flush=True)
        status, lines, seconds = run_one(name, args.quick, out_dir)
        print(f"{status} in {seconds:.0f} s", flush=True)
        all_ok &= status == "ok"
        report[name] = {"status": status, "seconds": round(seconds, 1), "log": str(out_dir / f"{name}.log")}
        report[name]["results"] = [asdict(line) | {"met": line.met} for line in lines]
        if status != "ok":
            table.append(f"{name:28s} {status.upper()} -- see {out_dir / (name + '.log')}")
        table += [format_line(line) for line in lines]
    (out_dir / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\n== benchmark ratios (each measured side by side with its reference in this run) ==")
    print("\n".join(table))
    print(f"\nlogs and results.json in {out_dir}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
