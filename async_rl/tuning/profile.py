"""The measured rates of one config (a JSON file), the fits the simulator uses, and the run that measures them.

A :class:`Profile` holds what the probes saw on this machine: generated tokens/s of one actor at several numbers of
sequences in flight, learner step times at world sizes 1 and 2 and two batch sizes, weight-update times at two model
sizes, the response lengths sampled, the mutual slow-down of actor and learner when they share the cores (measured by
running both at once), and settings timed both ways on the same work (:class:`SettingTrial`: the learner's compute
precision, shared-prompt layout and ranks x threads, the actor's rollout dtype; :mod:`async_rl.tuning.settings`
turns them into recommendations).
``Profile.to_json`` / ``Profile.from_json`` round-trip it, so ``tools/tune.py --profile FILE`` skips the minutes of
measuring.

:func:`measure` runs the probes (:mod:`async_rl.tuning.probes`) as child processes, in this order, so that no
measurement overlaps another's start-up: the vLLM probe and the 2-rank learner probe start together and meet at
file markers (both up -> generation alone -> learner alone -> both at once); then the 1-rank learner probe, which also
runs the setting trials, beside a vLLM probe of its own; on CPU the actor's precision trial (vLLM at two rollout
dtypes in turn); then ``tools/bench_weight_sync.py`` at two model sizes. It relays the probes' progress lines
and stops with a :class:`~async_rl.tuning.probes.ProbeError` naming the probe when one cannot measure.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from async_rl.config.names import CpuAllocator
from async_rl.runtime.allocator import child_env, search_dirs
from async_rl.tuning.probes import (
    CONTENDED_STEPS,
    KNOBS,
    LAYOUT_CONTENDED_STEPS,
    PROBE_FAILED,
    PROGRESS,
    ProbeError,
    median_step,
)
from async_rl.tuning.simulator import Curve, LearnerModel, SharedCompute, Workload

logger = logging.getLogger(__name__)
FORMAT = 1
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LearnerPoint:
    """One measured learner step: ``world_size`` ranks, ``groups`` prompt groups holding ``tokens`` tokens."""

    world_size: int
    groups: int
    tokens: int
    step_s: float


@dataclass(frozen=True)
class SyncPoint:
    """One measured weight update of ``nbytes`` into a running engine, end to end on the receiving side."""

    nbytes: int
    seconds: float


@dataclass(frozen=True)
class SettingTrial:
    """One setting timed at two values on the same work: ``times_s[i]`` are the times with ``key`` at ``values[i]``
    (labelled ``labels[i]``: how that ran, e.g. ``1 rank x 2 threads``). ``values[0]`` is the incumbent, the config's
    own value as it ran here (``auto`` resolved), which a recommendation keeps unless the other value was clearly
    faster; ``tokens`` is the work's size. A learner setting times learner steps on one batch; ``generation``: an
    actor setting, timing rounds of generation, each as the seconds one step's ``tokens`` took at its rate."""

    key: str
    values: tuple[str, str]
    labels: tuple[str, str]
    times_s: tuple[tuple[float, ...], tuple[float, ...]]
    tokens: int
    generation: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SettingTrial:
        a, b = data["times_s"]
        values, labels = tuple(data["values"]), tuple(data["labels"])
        return cls(data["key"], values, labels, (tuple(a), tuple(b)), data["tokens"], data.get("generation", False))


@dataclass(frozen=True)
class InJob:
    """What a short real run of the config (K = 0, so training never overlaps generation) adds to the probes.

    Inside the job the learner's ``train_step`` runs beside the coordinator thread, the actor's polling and the
    transport, on the same cores; the probes measure it alone. ``learner_factor`` = in-job step time / probe
    prediction for the same tokens; ``sync_s`` = the job's median ``sync/seconds`` (which includes the learner's
    FSDP gather); ``overhead_s`` = the rest of a step's wall time outside waiting, training and the broadcast. These
    apply to predictions on this machine only (the validation); recommendations for GPUs use the probes.
    """

    learner_factor: float
    sync_s: float
    overhead_s: float


@dataclass(frozen=True)
class Profile:
    """Measured rates of one config on one machine (see the module docstring)."""

    config: tuple[str, ...]
    overrides: tuple[str, ...]
    device: str
    cores: int
    group_size: int  # rollout.n
    groups_per_step: int  # data.train_batch_size
    max_concurrent_groups: int  # async_training.actor.max_concurrent_groups
    max_staleness: int
    sync_every: int
    prompt_len: float
    response_lengths: tuple[int, ...]
    gen_sequences: tuple[float, ...]  # sequences in flight ...
    gen_tokens_per_s: tuple[float, ...]  # ... and one actor's generated tokens/s there
    learner: tuple[LearnerPoint, ...]
    sync: tuple[SyncPoint, ...]
    model_bytes: int  # bytes of the config's weights as broadcast
    shared: SharedCompute | None = None  # slow-down when actor and learner share this machine's cores
    calibration: InJob | None = None  # the same pieces inside a short real job here (see InJob)
    settings: tuple[SettingTrial, ...] = ()  # learner settings timed both ways (empty in profiles made before them)

    # ---- fits ----------------------------------------------------------------------------------------------------
    def curve(self) -> Curve:
        return Curve(tuple(float(x) for x in self.gen_sequences), tuple(float(y) for y in self.gen_tokens_per_s))

    def workload(self, group_size: int | None = None) -> Workload:
        return Workload(group_size or self.group_size, self.response_lengths, self.prompt_len)

    def world_sizes(self) -> list[int]:
        return sorted({p.world_size for p in self.learner})

    def learner_model(self, world_size: int) -> LearnerModel:
        """``fixed_s + tokens / tokens_per_s`` fitted (least squares) to the points measured at ``world_size``."""
        pts = [(float(p.tokens), p.step_s) for p in self.learner if p.world_size == world_size]
        if not pts:
            raise ValueError(f"no learner measurement at world size {world_size}; have {self.world_sizes()}")
        fixed, per_token = _line(pts)
        return LearnerModel(fixed_s=fixed, tokens_per_s=1.0 / per_token)

    def sync_s(self, nbytes: int | None = None) -> float:
        """Time of one weight update of ``nbytes`` (default: this config's model), from a latency + bandwidth fit."""
        latency, per_byte = _line([(float(p.nbytes), p.seconds) for p in self.sync])
        return latency + per_byte * float(self.model_bytes if nbytes is None else nbytes)

    # ---- JSON ----------------------------------------------------------------------------------------------------
    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["format"] = FORMAT
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        data = json.loads(text)
        if data.pop("format", None) != FORMAT:
            raise ValueError(f"profile format must be {FORMAT}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown profile key(s) {unknown}")
        data["learner"] = tuple(LearnerPoint(**p) for p in data["learner"])
        data["sync"] = tuple(SyncPoint(**p) for p in data["sync"])
        data["shared"] = SharedCompute(**data["shared"]) if data.get("shared") else None
        data["calibration"] = InJob(**data["calibration"]) if data.get("calibration") else None
        data["settings"] = tuple(SettingTrial.from_dict(t) for t in data.get("settings", ()))
        for key in ("config", "overrides", "response_lengths", "gen_sequences", "gen_tokens_per_s"):
            data[key] = tuple(data[key])
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_json(Path(path).read_text())


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with ``a >= 0`` and ``b > 0`` (through the origin when a fit says otherwise)."""
    if len(points) == 1 or len({x for x, _ in points}) == 1:
        x = sum(x for x, _ in points) / len(points)
        y = sum(y for _, y in points) / len(points)
        return 0.0, y / max(x, 1e-12)
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    if b <= 0 or a < 0:  # noise made the line meaningless: proportional through the origin instead
        return 0.0, sum(y for _, y in points) / sum(x for x, _ in points)
    return a, b


# ---------------------------------------------------------------------------------------------------------------------
# Measuring


@dataclass(frozen=True)
class MeasureOptions:
    """How long and at which points the probes measure."""

    gen_groups: tuple[int, ...] = (1, 4, 16, 64)  # groups in flight (x rollout.n sequences), capped by the config
    gen_seconds: float = 5.0
    learner_steps: int = 3  # timed steps per batch size (after one warm-up)
    world_sizes: tuple[int, ...] = (1, 2)
    contended_seconds: float = 8.0  # generation and learner at once, for SharedCompute; longer while the learner
    # has not yet timed probes.CONTENDED_STEPS steps beside generation ...
    contend_slowdown: float = 6.0  # ... for at most this many times its step alone per step
    trial_rounds: int = 3  # rounds per setting trial, one step at each value each, after a warm-up step
    sync_sizes: tuple[tuple[int, int], ...] = ((128, 2), (512, 4))  # (hidden, layers) models for the sync fit
    timeout_s: float = 1800.0  # wall-clock cap on each probe run (the paired run: both probes together)
    reuse: bool = False  # keep probe results already in the work directory (re-measure only what is missing)

    def __post_init__(self) -> None:
        for name in ("learner_steps", "trial_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("gen_seconds", "contended_seconds", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.contend_slowdown >= 1:
            raise ValueError(f"contend_slowdown must be >= 1, got {self.contend_slowdown}")


def _probe_cmd(probe: str, params: dict[str, Any], out: Path, nproc: int | None = None) -> list[str]:
    if nproc is None:
        head = [sys.executable, "-m", "async_rl.tuning.probes"]
    else:
        head = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        head += ["-m", "async_rl.tuning.probes"]
    return [*head, probe, "--params", json.dumps(params), "--out", str(out)]


class _Relay:
    """Echo the probes' progress lines (:data:`~async_rl.tuning.probes.PROGRESS`) from their logs as they grow."""

    def __init__(self, logs: list[Path]) -> None:
        self.logs = logs
        self.read = [0] * len(logs)
        self.partial = [b""] * len(logs)

    def poll(self) -> None:
        for i, log in enumerate(self.logs):
            with open(log, "rb") as f:
                f.seek(self.read[i])
                chunk = f.read()
            self.read[i] += len(chunk)
            *lines, self.partial[i] = (self.partial[i] + chunk).split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                if line.startswith(PROGRESS):  # each names its probe
                    logger.info("%s", line[len(PROGRESS) :])


def _failure(log: Path, code: int | None) -> Exception:
    """The error for a probe that exited with ``code``: its own :class:`ProbeError` message when it printed one."""
    lines = log.read_text(errors="replace").splitlines()
    said = [line[len(PROBE_FAILED) :] for line in lines if line.startswith(PROBE_FAILED)]
    if said:
        return ProbeError(f"{said[0]} (log: {log})")
    tail = "\n  ".join(lines[-8:])
    return RuntimeError(f"profiling probe failed (exit {code}); see {log}, which ends:\n  {tail}")


def probe_env(allocator: CpuAllocator, env: Mapping[str, str]) -> dict[str, str]:
    """The probes' environment: ``env`` on the C allocator a run's learner ranks and actors would use
    (``async_training.cpu_allocator``; their entry points re-run themselves on tcmalloc, the probes are started on it),
    quiet warnings, and vLLM's CPU KV cache at 1 GiB unless set. Logs which allocator."""
    base, line, warn = child_env(allocator, env, search_dirs(env))
    logger.log(logging.WARNING if warn else logging.INFO, "profiling: %s", line)
    return {**base, "PYTHONWARNINGS": "ignore", "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1")}


def _run(cmds: list[list[str]], logs: list[Path], timeout_s: float, env: Mapping[str, str]) -> None:
    """Start the commands together in ``env`` (:func:`probe_env`), wait for all, relaying their progress; a failure
    stops the others and raises naming its log, and a run past ``timeout_s`` stops them all."""
    procs = []
    for cmd, log in zip(cmds, logs, strict=True):
        with open(log, "wb") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True))
    relay = _Relay(logs)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            relay.poll()
            codes = [p.poll() for p in procs]
            bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                raise _failure(logs[bad[0]], codes[bad[0]])
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                names = ", ".join(log.stem for log, c in zip(logs, codes, strict=True) if c is None)
                raise ProbeError(
                    f"probe {names} still running after {timeout_s:.0f} s (the probe time limit); raise"
                    f" --probe-timeout, or see {logs} for where it was"
                )
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 15)
                p.wait(timeout=30)


def _sync_point(hidden: int, layers: int, work: Path, timeout_s: float) -> SyncPoint:
    logger.info("profiling: weight sync of a hidden=%d layers=%d model", hidden, layers)
    log = work / f"sync-{hidden}x{layers}.log"
    cmd = [sys.executable, str(REPO_ROOT / "tools" / "bench_weight_sync.py"), "--hidden", str(hidden)]
    cmd += ["--layers", str(layers), "--reps", "2"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    log.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"tools/bench_weight_sync.py failed; see {log}")
    found = re.search(r"^\{$.*?^\}$", out.stdout, re.M | re.S)  # the report, printed with indent=2
    if found is None:
        raise RuntimeError(f"no JSON report from tools/bench_weight_sync.py; see {log}")
    report = json.loads(found.group(0))
    return SyncPoint(nbytes=int(report["model_mib"] * (1 << 20)), seconds=float(report["full_update_s"]))


def measure(config: list[str], overrides: list[str], work: Path, opts: MeasureOptions | None = None) -> Profile:
    """Run every probe on the real pieces for ``config`` and return the profile (logs under ``work``)."""
    from async_rl.config import load_config
    from async_rl.runtime import resources

    opts = opts or MeasureOptions()
    cfg = load_config(config, overrides)
    env = probe_env(cfg.async_training.cpu_allocator, os.environ)
    work.mkdir(parents=True, exist_ok=True)
    marks = work / "marks"
    marks.mkdir(exist_ok=True)
    n, b = cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size
    concurrent = cfg.async_training.actor.max_concurrent_groups
    most = max(1, min(concurrent, cfg.actor_rollout_ref.rollout.max_num_seqs // n))
    levels = sorted({min(g, most) for g in opts.gen_groups} | {most})
    common = {
        "config": config,
        "overrides": overrides,
        "workdir": str(work / "model"),
        "marks": str(marks),
        "timeout_s": opts.timeout_s,
        "contend_slowdown": opts.contend_slowdown,
    }
    gen_params = {**common, "levels": levels, "seconds": opts.gen_seconds, "contend_groups": most}
    gen_params["contend_seconds"] = opts.contended_seconds
    batches = sorted({max(1, b // 2), b})
    # The learner probe needs response lengths before generation has run: start from the config's maximum; the
    # step times are refitted per token, so the exact lengths matter little.
    lengths = [cfg.data.max_response_length]
    learner_params = {**common, "batch_sizes": batches, "steps": opts.learner_steps, "response_lengths": lengths}
    world_sizes = sorted(opts.world_sizes, reverse=True)
    first, last = world_sizes[0], world_sizes[-1]

    trials = {"trials": list(KNOBS), "trial_rounds": opts.trial_rounds}

    def params_at(ws: int) -> dict[str, Any]:  # the last learner probe also times the setting trials
        return {**learner_params, **trials} if ws == last else learner_params

    def paired(ws: int, gen_out: Path) -> None:  # generation and a learner probe together, meeting at the markers
        for old in marks.iterdir():
            old.unlink()
        learner_out, logs = work / f"learner-{ws}.json", [gen_out.with_suffix(".log"), work / f"learner-{ws}.log"]
        layout_only = ws != first  # only the first pair's contended steps feed the simulator
        steps = LAYOUT_CONTENDED_STEPS if layout_only else CONTENDED_STEPS
        # the layout pair's generation only has to load the cores: one level alone (its warm-up), not the whole curve
        gen_levels = [most] if layout_only else levels
        then = ", then the setting trials" if ws == last else ""
        logger.info(
            "profiling: vLLM generation at %s groups in flight, learner at world size %d%s", gen_levels, ws, then
        )
        gen_cmd = _probe_cmd("generation", {**gen_params, "levels": gen_levels, "contend_steps": steps}, gen_out)
        contend = {"contend": True, "contend_steps": steps, "contend_bound_ok": layout_only}
        learner_cmd = _probe_cmd("learner", {**params_at(ws), **contend}, learner_out, ws)
        _run([gen_cmd, learner_cmd], logs, opts.timeout_s, env)

    # every world size is timed beside generation too (each paired with a generation probe of its own), so the
    # ranks x threads trial compares the layouts as a run on this host shares its cores with the actor
    gen_out, points = work / "generation.json", []
    learner_runs: dict[int, dict[str, Any]] = {}
    for ws in world_sizes:
        out = work / f"learner-{ws}.json"
        this_gen = gen_out if ws == first else work / f"generation-beside-{ws}.json"
        if not (opts.reuse and this_gen.exists() and out.exists()):
            paired(ws, this_gen)
        learner_runs[ws] = json.loads(out.read_text())
    gen = json.loads(gen_out.read_text())
    for ws, run in learner_runs.items():
        points += [LearnerPoint(ws, p["groups"], p["tokens"], p["step_s"]) for p in run["points"]]
    shared = shared_compute(gen, learner_runs[first], b, most * n)
    settings = [knob_trial(t) for t in learner_runs[last].get("trials", [])]
    drift = drift_warning(learner_runs[last], batches[0])
    if drift is not None:
        logger.warning("%s", drift)
    layout = layout_trial(learner_runs, cfg.trainer.n_gpus_per_node, b)
    if layout is not None:
        settings.append(layout)
    if cfg.trainer.device == "cpu":  # on a GPU bf16 is the rule, and two engines would not share its memory
        dtype_trial = actor_precision_trial({**common, "groups": most}, work, opts, env)
        if dtype_trial is not None:
            settings.append(dtype_trial)
    sync = [_sync_point(hidden, layers, work, opts.timeout_s) for hidden, layers in opts.sync_sizes]
    model_dir = Path(resources.resolve_model_path(cfg.actor_rollout_ref.model.path, work / "model"))
    model_bytes = sync_bytes(cfg, model_dir)
    return Profile(
        config=tuple(config),
        overrides=tuple(overrides),
        device=cfg.trainer.device,
        cores=os.cpu_count() or 1,
        group_size=n,
        groups_per_step=b,
        max_concurrent_groups=concurrent,
        max_staleness=cfg.async_training.max_staleness,
        sync_every=cfg.async_training.sync_every_n_steps,
        prompt_len=float(gen["prompt_len_mean"]),
        response_lengths=tuple(int(x) for x in gen["response_lengths"]),
        gen_sequences=tuple(float(x) for x in gen["sequences_in_flight"]),
        gen_tokens_per_s=tuple(float(x) for x in gen["tokens_per_s"]),
        learner=tuple(points),
        sync=tuple(sync),
        model_bytes=model_bytes,
        shared=shared,
        settings=tuple(settings),
    )


def actor_precision_trial(
    params: dict[str, Any], work: Path, opts: MeasureOptions, env: Mapping[str, str]
) -> SettingTrial | None:
    """The rollout dtype timed both ways by the ``rollout_dtype`` probe (``params``: the probes' common parameters and
    ``groups`` in flight); None for a float16 rollout, which has nothing to compare with here."""
    out = work / "rollout-dtype.json"
    if not (opts.reuse and out.exists()):
        logger.info("profiling: the actor's precision, vLLM at two rollout dtypes in turn")
        params = {**params, "seconds": opts.gen_seconds, "rounds": opts.trial_rounds}
        _run([_probe_cmd("rollout_dtype", params, out)], [out.with_suffix(".log")], opts.timeout_s, env)
    result = json.loads(out.read_text())
    return None if result is None else knob_trial(result)


def knob_trial(result: dict[str, Any]) -> SettingTrial:
    """A setting trial from the learner probe's report of it (:func:`async_rl.tuning.probes._trial`)."""
    key = result["key"]
    leaf = key.rsplit(".", 1)[-1]
    base, other = result["values"]
    for value, times in zip(result["values"], result["times_s"], strict=True):
        median_step(times, f"setting trial {key}={value}", "set the tuner's trial rounds to at least 1")
    labels = (f"{leaf}={base}", f"{leaf}={other}")
    times = (tuple(result["times_s"][0]), tuple(result["times_s"][1]))
    return SettingTrial(key, (base, other), labels, times, result["tokens"], result.get("generation", False))


def shared_compute(gen: dict[str, Any], run: dict[str, Any], groups: int, sequences: int) -> SharedCompute | None:
    """How much generation and the learner slow each other on shared cores, from the paired probes: the generation
    probe's rate beside the learner against its rate alone at ``sequences`` in flight, and the learner ``run``'s step
    beside generation against its step alone at ``groups`` groups; None when either was not measured."""
    contended = run.get("contended_step_s")
    if not contended or not gen.get("contended_tokens_per_s"):
        return None
    alone = next(p["step_s"] for p in run["points"] if p["groups"] == groups)
    rate_alone = gen["tokens_per_s"][gen["sequences_in_flight"].index(sequences)]
    return SharedCompute(
        generation_factor=min(1.0, gen["contended_tokens_per_s"] / rate_alone),
        train_factor=min(1.0, alone / contended),
    )


DRIFT_LIMIT = 1.5
"""Timings of the same learner step in one probe further apart than this factor mean the machine's speed changed."""


def drift_warning(run: dict[str, Any], groups: int) -> str | None:
    """A warning when one learner probe timed the config's learner on the same ``groups`` twice (its timed steps, then
    as the incumbent in the setting trials) more than :data:`DRIFT_LIMIT` apart: the machine's speed changed while
    profiling (other jobs), so comparisons across separate runs (ranks x threads) are in doubt; else None."""
    point = next((p for p in run["points"] if p["groups"] == groups), None)
    again = [s for t in run.get("trials", []) for s in t["times_s"][0]]
    if point is None or not again:
        return None
    first, second = statistics.median(point["all_s"]), statistics.median(again)
    if 1 / DRIFT_LIMIT <= first / second <= DRIFT_LIMIT:
        return None
    return (
        f"the learner's step at world size {run['world_size']} on {groups} groups took {first:.3g} s in its timed"
        f" steps and {second:.3g} s in the setting trials: the machine's speed changed while profiling (other jobs?),"
        " so the ranks x threads comparison (separate runs) may be off; profile again with the machine otherwise idle"
    )


LAYOUT_KEY = "trainer.n_gpus_per_node"


def layout_trial(runs: dict[int, dict[str, Any]], configured: int, groups: int) -> SettingTrial | None:
    """Ranks x threads for the learner on this host, from the learner probes' ``runs`` by world size (torchrun gives
    each of several ranks one thread, one rank all the cores): the step at ``groups`` groups beside generation where
    both world sizes were timed beside it (a run here shares its cores with the actor; the learner alone can rank the
    layouts the other way), else alone. A side whose step beside generation is only a lower bound (none ended while
    generation ran) decides the trial only when that bound exceeds the other side's every step there; otherwise the
    layouts are compared alone. The ``configured`` world size first when it is 1 or 2; None unless both were
    measured."""
    if not {1, 2} <= set(runs):
        return None
    order = (configured, 3 - configured) if configured in (1, 2) else (2, 1)
    beside = all(runs[ws].get("contended_all_s") for ws in order)  # absent in results saved before it was recorded
    bounded = {ws for ws in order if runs[ws].get("contended_lower_bound")}
    if beside and bounded:  # a bound decides only against a side timed in full, and only when it exceeds its every step
        full = [ws for ws in order if ws not in bounded]
        beside = len(full) == 1 and all(
            min(runs[ws]["contended_all_s"]) > max(runs[full[0]]["contended_all_s"]) for ws in bounded
        )
    at = {ws: next(p for p in runs[ws]["points"] if p["groups"] == groups) for ws in order}
    times = {ws: runs[ws]["contended_all_s"] if beside else at[ws]["all_s"] for ws in order}

    def label(ws: int) -> str:
        threads = runs[ws].get("threads", "?")  # absent in learner probe results saved before it was recorded
        where = ", alone"
        if beside:
            where = ", beside generation" + (" (at least: no step ended there)" if ws in bounded else "")
        return f"{ws} rank{'s' if ws > 1 else ''} x {threads} thread{'' if threads == 1 else 's'}{where}"

    return SettingTrial(
        LAYOUT_KEY,
        (str(order[0]), str(order[1])),
        (label(order[0]), label(order[1])),
        (tuple(times[order[0]]), tuple(times[order[1]])),
        at[order[0]]["tokens"],
    )


def sync_bytes(cfg: Any, model_dir: Path) -> int:
    """Bytes one weight update of this config broadcasts: the model's safetensors, or in a LoRA run only the adapter's
    tensors (fp32, ``rank x (in + out)`` per adapted layer), counted on a model built on the meta device."""
    from async_rl.learner.lora import apply_lora, lora_modules, lora_spec

    spec = lora_spec(cfg.actor_rollout_ref.model)
    if spec is None:
        return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)))
    apply_lora(model, spec, seed=0)
    return sum(4 * (m.lora_A.numel() + m.lora_B.numel()) for _, m in lora_modules(model))
