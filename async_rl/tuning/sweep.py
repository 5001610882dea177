"""Staleness sweep: one config, several staleness bounds K, with and without off-policy correction, one or more seeds.

Asynchronous training trades freshness for throughput: a larger ``async_training.max_staleness`` keeps actors and
learner busier but trains on older samples, which ``algorithm.rollout_correction`` reweights. The sweep measures that
trade on this machine. For every (K, correction) pair it runs the whole job through ``launchers/local.py`` in its own
run directory, sequentially, with ``trainer.seed`` / ``data.seed`` pinned to the config's values; then
:mod:`async_rl.tuning.sweep_report` turns the runs' ``metrics.jsonl`` files into tables and plots.

``--seeds S ...`` runs every (K, correction) cell once per ``trainer.seed`` S (``data.seed`` stays the config's, so
every run sees the same prompts in the same order and draws its own samples), seed by seed, and the report adds a
table of each cell's mean and range over its seeds. One run per cell says little on a small model: on the SmolLM2
recipe as shipped the held-out accuracy at step 16 spread 0.480-0.615 over three seeds (2026-12-05, docs/recipes.md).

On the embedded demo config (model ``builtin:tiny-arith``) the tiny model is built and warm-started once, exactly as
the demo does it, and every run starts from that same warm model; any other model path is used as it is.

The sweep is resumable: a run whose ``metrics.jsonl`` already reached the requested step count is not repeated, and an
incomplete one is started again from scratch. A failed run is recorded (status, exit code, log path) and the sweep goes
on. With a lock file, each run (and the warm-start) holds an exclusive ``flock`` on it while it uses the CPUs, so a
long sweep interleaves with other heavy jobs that take the same lock instead of blocking them for its whole length.

::

    python tools/sweep_staleness.py [--config configs/demo_grpo.yaml] [--staleness 0 1 2 4 8] [--correction on off]
        [--steps N] [--seeds S ...] [--out outputs/sweep] [--quick] [--lock FILE] [--report-only]
        [dotted.key=value ...]

``--out`` holds one sweep: its runs are named by K and correction (and by seed with ``--seeds``:
``k1-corr-on-seed2``), so a later sweep in the same directory with more steps repeats them (and one with fewer steps
counts them as complete), and one with more seeds runs only the new seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILTIN_MODEL = "builtin:tiny-arith"
DEFAULT_STALENESS = (0, 1, 2, 4, 8)
# 10 demo runs of 200 steps: ~38 min of runs on this 2-core machine, extrapolated from a measured 10-run sweep of 60
# steps (16.3 min: start-up ~30-40 s a run; K = 0 ~0.73 s/step, K >= 1 ~0.9-1.2 s/step while actor and learner share
# the two cores), plus the ~35 s warm-start.
DEFAULT_STEPS = 200
QUICK_STALENESS = (0, 2)
QUICK_STEPS = 30
STATUS_FILE = "sweep_run.json"
# Keys the sweep sets itself for every run; a user override of one of them would silently break the comparison.
SWEPT_KEYS = (
    "async_training.max_staleness",
    "algorithm.rollout_correction.enable",
    "trainer.total_training_steps",
    "trainer.default_local_dir",
    "trainer.resume_mode",
)
SEED_KEY = "trainer.seed"  # set per run with --seeds; otherwise the config's (or an override's) value is pinned

logger = logging.getLogger(__name__)

__all__ = [
    "RunOutcome",
    "SweepRun",
    "completed_steps",
    "execute_run",
    "main",
    "plan_sweep",
    "run_name",
    "run_sweep",
]


def run_name(staleness: int, correction: bool, seed: int | None) -> str:
    """A run's name and directory: ``k1-corr-on``, or ``k1-corr-on-seed2`` for a run named by its seed."""
    cell = f"k{staleness}-corr-{'on' if correction else 'off'}"
    return cell if seed is None else f"{cell}-seed{seed}"


@dataclass(frozen=True)
class SweepRun:
    """One job of the sweep: its staleness bound, whether correction is on, its seed, and the launcher overrides that
    say so."""

    staleness: int
    correction: bool
    seed: int  # trainer.seed
    seed_in_name: bool  # --seeds: the run is named (and its directory) by its seed too
    steps: int
    run_dir: Path
    overrides: tuple[str, ...]  # every dotted override the launcher gets (the user's first, then the sweep's)

    @property
    def cell(self) -> str:
        """The (K, correction) cell, shared by the runs of every seed."""
        return run_name(self.staleness, self.correction, None)

    @property
    def name(self) -> str:
        return run_name(self.staleness, self.correction, self.seed if self.seed_in_name else None)

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def log_path(self) -> Path:
        """The launcher's output (the learner's, echoed); per-part logs are under ``run_dir/logs``."""
        return self.run_dir / "launcher.log"


@dataclass(frozen=True)
class RunOutcome:
    """What happened to a run: ``done`` (now or by an earlier sweep), ``failed`` or ``timeout``."""

    status: str
    seconds: float | None  # wall-clock of the whole job (launch to exit); None when unknown
    returncode: int | None
    log: Path

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "seconds": self.seconds, "returncode": self.returncode, "log": str(self.log)}


def _parse_correction(value: str) -> bool:
    if value not in ("on", "off"):
        raise ValueError(f"--correction takes 'on' and/or 'off', got {value!r}")
    return value == "on"


def plan_sweep(
    *,
    staleness: Sequence[int],
    corrections: Sequence[bool],
    steps: int,
    out: Path,
    seeds: Sequence[int],
    data_seed: int,
    seed_in_name: bool,
    base_overrides: Sequence[str] = (),
    warm_model: Path | None = None,
    critic: bool = False,
) -> list[SweepRun]:
    """The sweep's runs: seed by seed, and for each seed K-major (each K with correction on then off, in the order
    given), so a sweep stopped early holds whole tables of its first seeds.

    Each run pins ``trainer.seed`` to its seed and ``data.seed`` to ``data_seed``; ``seed_in_name`` (``--seeds``)
    names the runs by their seed too. ``warm_model`` (the warm model, when the sweep built one) replaces the actor's
    model path and, when the estimator needs a critic, the critic's too.
    """
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if not staleness or any(k < 0 for k in staleness) or len(set(staleness)) != len(staleness):
        raise ValueError(f"--staleness must be distinct non-negative integers, got {list(staleness)}")
    if not corrections or len(set(corrections)) != len(corrections):
        raise ValueError(f"--correction must be 'on' and/or 'off' without repeats, got {list(corrections)}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct integers, got {list(seeds)}")
    if len(seeds) > 1 and not seed_in_name:
        raise ValueError("several seeds need their runs named by seed (seed_in_name), or they would share directories")
    for override in base_overrides:
        key = override.split("=", 1)[0].strip()
        if key in SWEPT_KEYS:
            raise ValueError(
                f"override {override!r}: the sweep sets {key} itself (use --staleness/--correction/--steps)"
            )
        if key == SEED_KEY and seed_in_name:
            raise ValueError(f"override {override!r}: --seeds sets {key} for each run; give the seeds there")
    runs: list[SweepRun] = []
    for seed in seeds:
        for k in staleness:
            for correction in corrections:
                run_dir = out / "runs" / run_name(k, correction, seed if seed_in_name else None)
                fixed = [
                    f"{SEED_KEY}={seed}",
                    f"data.seed={data_seed}",
                    f"async_training.max_staleness={k}",
                    f"algorithm.rollout_correction.enable={'true' if correction else 'false'}",
                    f"trainer.total_training_steps={steps}",
                    f"trainer.default_local_dir={run_dir}",
                    "trainer.resume_mode=disable",
                ]
                if warm_model is not None:
                    fixed.append(f"actor_rollout_ref.model.path={warm_model}")
                    if critic:
                        fixed.append(f"critic.model.path={warm_model}")
                runs.append(SweepRun(k, correction, seed, seed_in_name, steps, run_dir, (*base_overrides, *fixed)))
    return runs


def completed_steps(metrics_path: Path) -> int:
    """The largest step logged in ``metrics_path`` (0 when the file is missing or holds no step)."""
    from async_rl.runtime.metrics import read_metrics

    if not metrics_path.is_file():
        return 0
    try:
        records = read_metrics(metrics_path)
    except ValueError as exc:
        logger.warning("sweep: %s is unreadable (%s); the run will be repeated", metrics_path, exc)
        return 0
    steps = [r["step"] for r in records if isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool)]
    return max(steps, default=0)


def read_outcome(run: SweepRun) -> RunOutcome | None:
    """The outcome an earlier sweep recorded in the run directory, if any."""
    path = run.run_dir / STATUS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return RunOutcome(data["status"], data.get("seconds"), data.get("returncode"), Path(data["log"]))
    except (ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def cpu_lock(path: Path | None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block; no-op without a path."""
    if path is None:
        yield
        return
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("sweep: waiting for the lock %s (another heavy job holds it)", path)
            started = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            logger.info("sweep: got the lock after %.0f s", time.monotonic() - started)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def launcher_command(run: SweepRun, config: str, nproc_per_node: int) -> list[str]:
    """The ``launchers/local.py`` command line of one run (its logs go under the run directory)."""
    return [
        sys.executable,
        str(REPO_ROOT / "launchers" / "local.py"),
        "--config",
        config,
        "--nproc-per-node",
        str(nproc_per_node),
        "--run-dir",
        str(run.run_dir),
        *run.overrides,
    ]


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 60.0) -> None:
    """SIGTERM the launcher (it forwards to every part and kills them after its own grace), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def execute_run(
    run: SweepRun, *, config: str, timeout_s: float | None, nproc_per_node: int = 2, lock: Path | None = None
) -> RunOutcome:
    """Run one job from scratch (its old run directory is removed) and return how it ended."""
    if run.run_dir.exists():
        shutil.rmtree(run.run_dir)
    run.run_dir.mkdir(parents=True)
    cmd = launcher_command(run, config, nproc_per_node)
    with cpu_lock(lock), run.log_path.open("wb") as log:
        log.write((" ".join(cmd) + "\n").encode())
        log.flush()
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            returncode = proc.wait(timeout=timeout_s)
            status = "done" if returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            _stop(proc)
            returncode, status = proc.returncode, "timeout"
        except BaseException:  # Ctrl-C: let the launcher stop its parts before the sweep exits
            _stop(proc)
            raise
        seconds = round(time.monotonic() - started, 1)
    if status == "done" and completed_steps(run.metrics_path) < run.steps:
        status = "failed"  # exited 0 without logging every step: not a comparable run
    return RunOutcome(status, seconds, returncode, run.log_path)


Executor = Callable[[SweepRun], RunOutcome]


def _eta(seconds_per_step: list[float], remaining_steps: int) -> str:
    """Minutes left if the remaining steps go as fast (start-up included) as the runs executed so far."""
    if not seconds_per_step:
        return "n/a"
    return f"{sum(seconds_per_step) / len(seconds_per_step) * remaining_steps / 60:.1f} min"


def _print(line: str) -> None:
    print(line, flush=True)


def run_sweep(
    runs: Sequence[SweepRun], execute: Executor, *, print_fn: Callable[[str], None] = _print
) -> list[RunOutcome]:
    """Run every job in order through ``execute``, skipping the ones already complete; one outcome per run.

    Each outcome is also written to ``<run_dir>/sweep_run.json`` so a later sweep (or the report) can read it. The ETA
    extrapolates the seconds per step of the runs executed so far over the steps still to run.
    """
    outcomes: list[RunOutcome] = []
    per_step: list[float] = []
    per_run_executed: list[bool] = []
    started = time.monotonic()
    for i, run in enumerate(runs, start=1):
        remaining = sum(r.steps for r in runs[i - 1 :] if completed_steps(r.metrics_path) < r.steps)
        prefix = f"[sweep] run {i}/{len(runs)} {run.name}"
        if completed_steps(run.metrics_path) >= run.steps:
            earlier = read_outcome(run)
            outcome = RunOutcome("done", earlier.seconds if earlier is not None else None, 0, run.log_path)
            print_fn(f"{prefix}: already complete ({run.steps} steps), skipped")
            per_run_executed.append(False)
        else:
            print_fn(f"{prefix}: starting ({run.steps} steps; sweep ETA {_eta(per_step, remaining)})")
            outcome = execute(run)
            per_run_executed.append(True)
            if outcome.status == "done" and outcome.seconds:
                per_step.append(outcome.seconds / run.steps)
            print_fn(f"{prefix}: {outcome.status} in {outcome.seconds} s (log {outcome.log})")
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / STATUS_FILE).write_text(json.dumps(outcome.to_json(), indent=2) + "\n")
        outcomes.append(outcome)
    ran = sum(o.seconds or 0.0 for o, r in zip(outcomes, per_run_executed, strict=True) if r)
    print_fn(
        f"[sweep] {len(runs)} runs finished in {(time.monotonic() - started) / 60:.1f} min"
        f" ({sum(per_run_executed)} executed, {ran / 60:.1f} min of runs; the rest skipped or waiting for the lock)"
    )
    return outcomes


_OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.\w+)+=")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """Options and the ``dotted.key=value`` overrides; overrides may stand anywhere, even after ``--staleness 0 1``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = [a for a in argv if _OVERRIDE.match(a)]
    parser = argparse.ArgumentParser(
        prog="python tools/sweep_staleness.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "demo_grpo.yaml"), help="config YAML")
    parser.add_argument("--staleness", type=int, nargs="+", default=None, help="K values [0 1 2 4 8; --quick: 0 2]")
    parser.add_argument("--correction", nargs="+", default=["on", "off"], help="off-policy correction: on and/or off")
    parser.add_argument(
        "--steps", type=int, default=None, help=f"steps per run [{DEFAULT_STEPS}; --quick: {QUICK_STEPS}]"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="trainer.seed values: each (K, correction) cell runs once per seed [once, at the config's trainer.seed]",
    )
    parser.add_argument("--out", default="outputs/sweep", help="sweep directory (runs, table, plots)")
    parser.add_argument("--quick", action="store_true", help=f"K in {QUICK_STALENESS}, {QUICK_STEPS} steps: minutes")
    parser.add_argument("--nproc-per-node", type=int, default=2, help="learner ranks")
    parser.add_argument("--warmstart-steps", type=int, default=1000, help="supervised warm-start steps (demo model)")
    parser.add_argument("--run-timeout-s", type=float, default=None, help="stop a run after this long [no limit]")
    parser.add_argument("--lock", default=None, help="flock this file around each run and the warm-start")
    parser.add_argument("--report-only", action="store_true", help="only (re)write the table and plots of --out's runs")
    return parser.parse_args([a for a in argv if not _OVERRIDE.match(a)]), overrides


def _warm_model(out: Path, steps: int, lock: Path | None) -> Path:
    """Build and warm-start the demo's tiny model under ``out/warm_start`` once; later sweeps in ``out`` reuse it."""
    run_dir = out / "warm_start"
    marker = run_dir / "warmstart.json"
    if marker.is_file() and json.loads(marker.read_text()).get("warmstart/steps") == steps:
        from async_rl.runtime.supervised import EXPORT_DIR

        logger.info("sweep: reusing the warm model in %s", run_dir / EXPORT_DIR)
        return run_dir / EXPORT_DIR
    with cpu_lock(lock):
        from async_rl.data import make_arith_problems
        from async_rl.demo.warmstart import prepare_warm_model

        held_out = make_arith_problems(200, seed=0, digits=2, split="eval")
        model_dir, result = prepare_warm_model(run_dir, steps=steps, held_out=held_out)
    logger.info(
        "sweep: warm-start %d steps in %.0f s; held-out greedy accuracy %.3f",
        steps,
        result["warmstart/seconds"],
        result["heldout_greedy_accuracy"],
    )
    marker.write_text(json.dumps(result, indent=2) + "\n")
    return model_dir


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through execute_run, which stops the launcher and its parts first


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _sweep(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sweep(argv: Sequence[str] | None) -> int:
    args, overrides = parse_args(argv)
    from async_rl.config import load_config
    from async_rl.config.names import needs_critic
    from async_rl.tuning.sweep_report import write_report

    cfg = load_config([args.config], overrides)  # fail on a bad config before any run
    staleness = args.staleness or list(QUICK_STALENESS if args.quick else DEFAULT_STALENESS)
    steps = args.steps or (QUICK_STEPS if args.quick else DEFAULT_STEPS)
    corrections = [_parse_correction(c) for c in args.correction]
    out = Path(args.out).resolve()
    config = str(Path(args.config).resolve())  # the launcher runs from the repository root
    lock = Path(args.lock) if args.lock else None
    builtin = cfg.actor_rollout_ref.model.path == BUILTIN_MODEL
    plan_kwargs: dict[str, Any] = {
        "staleness": staleness,
        "corrections": corrections,
        "steps": steps,
        "out": out,
        "seeds": args.seeds or [cfg.trainer.seed],
        "data_seed": cfg.data.seed,
        "seed_in_name": args.seeds is not None,
        "base_overrides": overrides,
    }
    runs = plan_sweep(**plan_kwargs)  # validate the plan before spending a minute on the warm-start
    outcomes: list[RunOutcome | None]
    if args.report_only:
        outcomes = [read_outcome(run) for run in runs]
    else:
        model_path = _warm_model(out, args.warmstart_steps, lock) if builtin else None
        runs = plan_sweep(**plan_kwargs, warm_model=model_path, critic=needs_critic(cfg.algorithm.adv_estimator))
        _print(
            f"[sweep] {len(runs)} runs of {steps} steps: K in {staleness}, correction {args.correction},"
            f" trainer.seed in {plan_kwargs['seeds']}; out {out}"
        )

        def execute(run: SweepRun) -> RunOutcome:
            return execute_run(
                run, config=config, nproc_per_node=args.nproc_per_node, timeout_s=args.run_timeout_s, lock=lock
            )

        outcomes = list(run_sweep(runs, execute))
    paths = write_report(runs, outcomes, out)
    print((out / "sweep.md").read_text())
    print("[sweep] wrote " + ", ".join(str(p) for p in paths))
    return 0 if all(o is not None and o.status == "done" for o in outcomes) else 1
