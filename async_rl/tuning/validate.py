"""Check the simulator against real runs on this machine: run the job, read its metrics, compare steps/s.

First a calibration run of the profiled config itself at K = 0 (:func:`calibrate`) measures what the isolated probes
cannot see: the learner's step inside the job (beside the coordinator and the actor on the same cores), the in-job
broadcast and the per-step bookkeeping (:class:`InJob`). The validation cases then differ from it in batch size,
rollout.n, max_staleness and concurrency, so they test the simulator's predictions, not the calibration.

Each validation case is the config plus a few overrides (batch size, rollout.n, max_staleness), run for real through
``launchers/local.py`` (vLLM actor(s), the torchrun learner, ZeroMQ, weight sync) for a few dozen steps. Measured
steps/s is ``(N - w) / (wall_N - wall_w)`` from ``metrics.jsonl`` (``time/wall_s`` at step N, after ``w`` warm-up
steps: engine start-up and first compilations). The prediction simulates the same deployment from the profile,
including the measured shared-compute slow-down, since here actors and learner share the same cores.
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from async_rl import metric_catalog as mc
from async_rl.tuning.profile import REPO_ROOT, InJob, Profile
from async_rl.tuning.simulator import LearnerModel, SharedCompute, SimConfig, SimResult, simulate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Case:
    """One real configuration: a name and the overrides that differ from the profiled config."""

    name: str
    groups_per_step: int
    group_size: int
    max_staleness: int
    max_concurrent_groups: int

    def overrides(self) -> list[str]:
        return [
            f"data.train_batch_size={self.groups_per_step}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={self.groups_per_step}",
            f"actor_rollout_ref.rollout.n={self.group_size}",
            f"async_training.max_staleness={self.max_staleness}",
            f"async_training.actor.max_concurrent_groups={self.max_concurrent_groups}",
        ]


DEFAULT_CASES = (
    Case("B64_n4_K2", 64, 4, 2, 64),  # the demo as shipped: the learner is the bottleneck
    Case("B32_n4_K0_c32", 32, 4, 0, 32),  # synchronous, half the batch: generate, then train, then sync
    Case("B32_n8_K1_c16", 32, 8, 1, 16),  # more samples per prompt, fewer groups in flight
)


@dataclass(frozen=True)
class Outcome:
    case: Case
    measured_steps_per_s: float
    measured_learner_idle: float
    predicted: SimResult
    pipeline_only: SimResult  # the simulator fed with the run's own median train and sync times (diagnostic)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured steps/s."""
        return (self.predicted.steps_per_s - self.measured_steps_per_s) / self.measured_steps_per_s

    @property
    def pipeline_error(self) -> float:
        return (self.pipeline_only.steps_per_s - self.measured_steps_per_s) / self.measured_steps_per_s


def sim_config(profile: Profile, case: Case, steps: int, warmup: int, learner_ranks: int = 2) -> SimConfig:
    learner = profile.learner_model(learner_ranks)
    sync_s = profile.sync_s()
    cal = profile.calibration
    if cal is not None:
        f = cal.learner_factor
        learner = LearnerModel(fixed_s=learner.fixed_s * f + cal.overhead_s, tokens_per_s=learner.tokens_per_s / f)
        sync_s = cal.sync_s
    return SimConfig(
        workload=profile.workload(case.group_size),
        actor_curve=profile.curve(),
        learner=learner,
        num_actors=1,
        max_concurrent_groups=case.max_concurrent_groups,
        groups_per_step=case.groups_per_step,
        max_staleness=case.max_staleness,
        sync_s=sync_s,
        sync_every=profile.sync_every,
        steps=steps,
        warmup_steps=warmup,
        shared=profile.shared,
    )


def predict(profile: Profile, case: Case, steps: int, warmup: int) -> SimResult:
    return simulate(sim_config(profile, case, steps, warmup))


def calibrate(profile: Profile, out: Path, steps: int = 20, warmup: int = 5, rerun: bool = True) -> Profile:
    """Run the profiled config at K = 0 for ``steps`` steps and return the profile with its :class:`InJob`."""
    case = Case("calibrate_K0", profile.groups_per_step, profile.group_size, 0, profile.max_concurrent_groups)
    existing = out / case.name / "out" / "metrics.jsonl"
    rows = read_rows(existing if not rerun and existing.exists() else run_case(profile, case, out, steps))
    by_step = {int(r["step"]): r for r in rows}
    train, sync, rest, ratio = [], [], [], []
    model = profile.learner_model(2)
    tokens = profile.group_size * profile.groups_per_step * profile.prompt_len
    for s in sorted(by_step):
        if s <= warmup or s - 1 not in by_step:
            continue
        r = by_step[s]
        wall = float(r[mc.TIME_WALL_S]) - float(by_step[s - 1][mc.TIME_WALL_S])
        t, y = float(r[mc.LEARNER_PERF_STEP_TIME_S]), float(r.get(mc.SYNC_SECONDS, 0.0))
        wait = float(r.get(mc.LEARNER_IDLE_FRACTION, 0.0)) * wall
        train.append(t)
        sync.append(y)
        rest.append(max(0.0, wall - t - y - wait))
        step_tokens = tokens + float(r.get(mc.ROLLOUT_GENERATED_TOKENS, 0.0))
        ratio.append(t / model.step_s(step_tokens))
    if not train:
        raise ValueError(f"calibration run logged no steps after warm-up {warmup}")
    cal = InJob(
        learner_factor=statistics.median(ratio), sync_s=statistics.median(sync), overhead_s=statistics.median(rest)
    )
    logger.info("in-job calibration: learner x%.2f, sync %.3f s, overhead %.3f s per step", *cal.__dict__.values())
    return replace(profile, calibration=cal)


def predict_from_run(profile: Profile, case: Case, rows: list[dict[str, float]], steps: int, warmup: int) -> SimResult:
    """Diagnostic: the same simulation with the learner's step and sync times taken from the run itself.

    It separates the two error sources: the pipeline model (admission, overlap, staleness) and the component rates
    the profile measured. The run's train time already includes any slow-down from sharing cores, so only the
    actor's share of it stays modelled.
    """
    after = [r for r in rows if int(r["step"]) > warmup]
    train = statistics.median(float(r[mc.LEARNER_PERF_STEP_TIME_S]) for r in after)
    sync = statistics.median(float(r.get(mc.SYNC_SECONDS, 0.0)) for r in after)
    gen_factor = profile.shared.generation_factor if profile.shared is not None else 1.0
    overhead = profile.calibration.overhead_s if profile.calibration is not None else 0.0
    cfg = replace(
        sim_config(replace(profile, calibration=None), case, steps, warmup),
        learner=LearnerModel(fixed_s=train + overhead, tokens_per_s=1e12),
        sync_s=sync,
        shared=SharedCompute(generation_factor=gen_factor, train_factor=1.0),
    )
    return simulate(cfg)


def measured_rate(rows: list[dict[str, float]], warmup: int) -> tuple[float, float]:
    """Steps/s after ``warmup`` steps and the mean learner idle fraction over the same steps."""
    by_step = {int(r["step"]): r for r in rows if mc.TIME_WALL_S in r}
    last = max(by_step)
    if last <= warmup or warmup not in by_step:
        raise ValueError(f"need more than {warmup} logged steps, got {sorted(by_step)[:5]}...")
    rate = (last - warmup) / (by_step[last][mc.TIME_WALL_S] - by_step[warmup][mc.TIME_WALL_S])
    idle = [by_step[s].get(mc.LEARNER_IDLE_FRACTION, 0.0) for s in range(warmup + 1, last + 1) if s in by_step]
    return rate, sum(idle) / max(len(idle), 1)


def read_rows(path: Path) -> list[dict[str, float]]:
    """The training steps' rows of a run's ``metrics.jsonl``: a validation round logs a row of its own (``val/*``)
    under the same step, which would otherwise stand in for that step's row."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if mc.LEARNER_PERF_STEP_TIME_S in r]


def run_case(profile: Profile, case: Case, out: Path, steps: int, timeout_s: float = 900.0) -> Path:
    """Run the real job for ``case`` through the local launcher; returns its metrics.jsonl."""
    run_dir = out / case.name
    cmd = [sys.executable, str(REPO_ROOT / "launchers" / "local.py")]
    cmd += [a for c in profile.config for a in ("--config", c)]
    cmd += ["--nproc-per-node", "2", "--actors", "1", "--run-dir", str(run_dir)]
    cmd += [*profile.overrides, *case.overrides(), f"trainer.total_training_steps={steps}"]
    cmd += [f"trainer.default_local_dir={run_dir / 'out'}", "trainer.logger=[jsonl]", "trainer.save_freq=-1"]
    cmd += ["trainer.test_freq=-1", "trainer.val_before_train=false"]  # the simulator has no validation rounds
    run_dir.mkdir(parents=True, exist_ok=True)
    logger.info("validation run %s: %s", case.name, " ".join(cmd))
    with open(run_dir / "launcher.log", "wb") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False).returncode
    metrics = run_dir / "out" / "metrics.jsonl"
    if code != 0 or not metrics.exists():
        raise RuntimeError(f"validation run {case.name} failed (exit {code}); see {run_dir / 'launcher.log'}")
    return metrics


def validate(
    profile: Profile,
    out: Path,
    cases: tuple[Case, ...] = DEFAULT_CASES,
    steps: int = 30,
    warmup: int = 5,
    rerun: bool = True,
) -> list[Outcome]:
    """Run (or, with ``rerun=False``, re-read finished runs of) every case and compare with the simulator."""
    outcomes = []
    for case in cases:
        existing = out / case.name / "out" / "metrics.jsonl"
        metrics = existing if not rerun and existing.exists() else run_case(profile, case, out, steps)
        rows = read_rows(metrics)
        rate, idle = measured_rate(rows, warmup)
        pipeline = predict_from_run(profile, case, rows, steps, warmup)
        outcomes.append(Outcome(case, rate, idle, predict(profile, case, steps, warmup), pipeline))
        o = outcomes[-1]
        logger.info(
            "%s: measured %.3f steps/s, predicted %.3f (%+.1f%%)",
            case.name,
            rate,
            o.predicted.steps_per_s,
            100 * o.error,
        )
    return outcomes


def format_outcomes(outcomes: list[Outcome]) -> str:
    head = "| case | B | n | K | conc | measured steps/s | predicted steps/s | error | learner idle meas/pred |"
    head += " pipeline-only error |"
    lines = [head, "|" + "---|" * 10]
    for o in outcomes:
        c = o.case
        lines.append(
            f"| {c.name} | {c.groups_per_step} | {c.group_size} | {c.max_staleness} | {c.max_concurrent_groups} | "
            f"{o.measured_steps_per_s:.3f} | {o.predicted.steps_per_s:.3f} | {100 * o.error:+.1f}% | "
            f"{o.measured_learner_idle:.2f} / {o.predicted.learner_idle_fraction:.2f} | "
            f"{100 * o.pipeline_error:+.1f}% |"
        )
    if outcomes:
        worst = max(abs(o.error) for o in outcomes)
        lines.append(f"\nworst |error| {100 * worst:.1f}% (target 15%)")
        lines.append(
            "pipeline-only: the simulator given the run's own median learner step and sync times (from metrics.jsonl)"
            " plus the calibrated per-step overhead;"
            " its error isolates the pipeline model from the profiled component rates."
        )
    return "\n".join(lines)
