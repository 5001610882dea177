"""The probes' failure modes and the contended-learner protocol, with a fake learner step and a real marker directory;
the tuner's probe runner with real child processes (a progress line relayed, a probe's own error, the time limit)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from async_rl.runtime.allocator import REEXEC_MARK, find_tcmalloc, search_dirs
from async_rl.tuning import probes
from async_rl.tuning.probes import (
    CONTENDED_STEPS,
    LAYOUT_CONTENDED_STEPS,
    PROBE_FAILED,
    PROGRESS,
    ProbeError,
    clear_winner,
    median_step,
)
from async_rl.tuning.profile import MeasureOptions, _run, probe_env


def test_median_step_names_the_probe_and_the_fix() -> None:
    assert median_step([3.0, 1.0, 2.0], "p", "f") == 2.0
    assert median_step([4.0, 5.0], "p", "f", least=2) == 4.5
    with pytest.raises(ProbeError, match=r"^learner probe: 0 step\(s\) recorded, 1 needed; raise X$"):
        median_step([], "learner probe", "raise X")
    with pytest.raises(ProbeError, match=r"1 step\(s\) recorded, 2 needed"):
        median_step([30.0], "learner probe", "raise X", least=2)


def _bench(tmp_path: Path) -> probes._Bench:
    marks = tmp_path / "marks"
    marks.mkdir()
    params = {"marks": str(marks), "contend_slowdown": 6.0}
    ctx = SimpleNamespace(is_rank0=True, broadcast_bytes=lambda flag: flag)
    return probes._Bench(params, ctx, "model", [], vocab=64, minis_per_step=1)


def _script(
    bench: probes._Bench, durations: list[float], events: dict[int, str]
) -> tuple[list[int], Callable[..., float]]:
    """A fake learner step: the i-th step returns ``durations[i]`` and, while it runs, the generation probe leaves
    marker ``events[i]`` (if any). Returns the list of steps run (filled in as they run) and the step."""
    ran: list[int] = []

    def step(ctx: Any, learner: Any, groups: Any, prompts: Any) -> float:
        i = len(ran)
        ran.append(i)
        if i in events:
            probes._signal(bench.params, events[i])
        return durations[i]

    return ran, step


def test_contended_counts_only_steps_that_ended_while_generation_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _bench(tmp_path)
    marks = Path(bench.params["marks"])
    # step 0 is a warm-up (generation starts during it); steps 1 and 2 run beside generation (30 s and 50 s); the
    # learner then says it has enough, generation stops during step 3 (10 s), which ran partly alone: not counted
    ran, step = _script(bench, [20.0, 30.0, 50.0, 10.0], {0: "gen_started", 3: "gen_done"})
    monkeypatch.setattr(probes, "_timed_step", step)
    assert probes._contended(bench, None, [], {}, 12.5, "learner probe", CONTENDED_STEPS, bound_ok=False) == (
        [30.0, 50.0],
        False,
    )
    assert ran == [0, 1, 2, 3]
    assert (marks / "learner_alone_done").read_text() == "12.5"  # the generation probe sizes its cap from it
    assert (marks / "learner_contended_enough").exists() and CONTENDED_STEPS == 2


def test_the_layout_probe_needs_one_step_beside_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the demo's 1 rank x 2 threads beside vLLM on 2 cores: 5.75 s a step against 0.2 s alone; generation stops
    # (its cap) during the next one, so one step is all there is, and it decides the ranks x threads trial
    bench = _bench(tmp_path)
    ran, step = _script(bench, [0.2, 5.75, 0.3], {0: "gen_started", 2: "gen_done"})
    monkeypatch.setattr(probes, "_timed_step", step)
    got = probes._contended(bench, None, [], {}, 0.2, "learner probe", LAYOUT_CONTENDED_STEPS, bound_ok=True)
    assert got == ([5.75], False)
    assert ran == [0, 1, 2] and (Path(bench.params["marks"]) / "learner_contended_enough").exists()


def test_a_layout_probe_starved_past_generation_returns_its_step_as_a_lower_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SmolLM2's 1 rank x 2 threads beside vLLM on 2 cores: 11.5 s a step alone, and no step ended in the 152 s
    # generation waited; the step that started beside it (160 s, partly alone after) is at most what a step there takes
    bench = _bench(tmp_path)
    ran, step = _script(bench, [11.5, 160.0], {0: "gen_started", 1: "gen_done"})
    monkeypatch.setattr(probes, "_timed_step", step)
    got = probes._contended(bench, None, [], {}, 11.5, "learner probe", LAYOUT_CONTENDED_STEPS, bound_ok=True)
    assert got == ([160.0], True) and ran == [0, 1]
    assert not (Path(bench.params["marks"]) / "learner_contended_enough").exists()
    # the demo's 1 x 2: generation started and gave up during the one step that began before it: also a lower bound
    (tmp_path / "spanning").mkdir()
    spanning = _bench(tmp_path / "spanning")
    steps: list[int] = []

    def through_all_of_it(ctx: Any, learner: Any, groups: Any, prompts: Any) -> float:
        steps.append(len(steps))
        for marker in ("gen_started", "gen_done"):  # both appear while step 0 runs
            probes._signal(spanning.params, marker)
        return 12.0

    monkeypatch.setattr(probes, "_timed_step", through_all_of_it)
    got = probes._contended(spanning, None, [], {}, 0.2, "learner probe", LAYOUT_CONTENDED_STEPS, bound_ok=True)
    assert got == ([12.0], True) and steps == [0]


def test_contended_with_no_step_recorded_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a real model's step outlasting generation: generation gave up (its cap) during the first timed step
    bench = _bench(tmp_path)
    ran, step = _script(bench, [40.0, 300.0], {0: "gen_started", 1: "gen_done"})
    monkeypatch.setattr(probes, "_timed_step", step)
    with pytest.raises(ProbeError) as err:
        probes._contended(
            bench,
            None,
            [],
            {},
            40.0,
            "learner probe (world size 2, 1 thread(s) per rank)",
            CONTENDED_STEPS,
            bound_ok=False,
        )
    assert str(err.value) == (
        "learner probe (world size 2, 1 thread(s) per rank), beside generation: 0 step(s) recorded, 2 needed;"
        " generation stopped waiting after 6x the step time alone per step: the learner is starved beside vLLM"
        " here; free the machine's cores, or raise --contend-slowdown"
    )
    assert ran == [0, 1] and not (Path(bench.params["marks"]) / "learner_contended_enough").exists()


def test_measure_options_refuse_zero_steps() -> None:
    with pytest.raises(ValueError, match="learner_steps must be >= 1, got 0"):
        MeasureOptions(learner_steps=0)
    with pytest.raises(ValueError, match="trial_rounds must be >= 1"):
        MeasureOptions(trial_rounds=0)
    with pytest.raises(ValueError, match="contend_slowdown must be >= 1"):
        MeasureOptions(contend_slowdown=0.5)


def _child(tmp_path: Path, name: str, code: str) -> tuple[list[str], Path]:
    return [sys.executable, "-c", code], tmp_path / f"{name}.log"


def test_run_relays_progress_and_raises_the_probes_own_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    failing = f"print({PROGRESS!r} + 'learner world 2: step 1/3: 38.1 s'); print('noise'); "
    failing += f"print({PROBE_FAILED!r} + 'learner probe: 0 step(s) recorded'); raise SystemExit(3)"
    cmd, log = _child(tmp_path, "learner-2", failing)
    sleeper, slog = _child(tmp_path, "generation", "import time; time.sleep(60)")
    caplog.set_level(logging.INFO, logger="async_rl.tuning.profile")
    with pytest.raises(ProbeError, match=rf"^learner probe: 0 step\(s\) recorded \(log: {log}\)$"):
        _run([cmd, sleeper], [log, slog], timeout_s=60, env=os.environ)
    assert "learner world 2: step 1/3: 38.1 s" in caplog.messages
    assert not any("noise" in m for m in caplog.messages)


def test_run_without_a_probe_message_shows_the_log_tail_and_stops_at_the_limit(tmp_path: Path) -> None:
    cmd, log = _child(tmp_path, "learner-1", "import sys; print('Traceback: boom'); sys.exit(1)")
    with pytest.raises(RuntimeError, match=r"exit 1\); see .*learner-1.log, which ends:\n  Traceback: boom"):
        _run([cmd], [log], timeout_s=60, env=os.environ)
    cmd, log = _child(tmp_path, "learner-2", "import time; time.sleep(60)")
    with pytest.raises(ProbeError, match=r"probe learner-2 still running after 1 s .*raise --probe-timeout"):
        _run([cmd], [log], timeout_s=1, env=os.environ)


def test_the_probes_run_on_the_allocator_a_runs_ranks_would_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run's learner ranks re-run themselves on tcmalloc; the probes that time them must too (on the system malloc
    an fp32 SmolLM2 step was 1.8x slower, enough to flip the precision trial)."""
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", REEXEC_MARK)}
    library = find_tcmalloc(search_dirs(base))
    code = "print('mapped', 'libtcmalloc' in open('/proc/self/maps').read())"
    caplog.set_level(logging.INFO, logger="async_rl.tuning.profile")
    for choice, mapped in (("auto", library is not None), ("system", False)):
        env = probe_env(choice, base)
        assert env["PYTHONWARNINGS"] == "ignore"
        cmd, log = _child(tmp_path, f"learner-{choice}", code)
        _run([cmd], [log], timeout_s=60, env=env)
        assert log.read_text().splitlines() == [f"mapped {mapped}"]
    said = [m for m in caplog.messages if m.startswith("profiling: allocator:")]
    assert said[-1] == "profiling: allocator: the system malloc (async_training.cpu_allocator=system)"
    if library is not None:
        assert said[0] == f"profiling: allocator: tcmalloc ({library})"
    else:
        assert "no tcmalloc found" in said[0]


def test_a_trial_is_decided_early_only_when_every_step_of_one_side_is_twice_the_other() -> None:
    assert clear_winner([15.4], [218.5])  # fp32 vs bf16 emulated on an AVX2 CPU (measured on SmolLM2)
    assert clear_winner([218.5, 230.0], [15.4, 16.0])
    assert not clear_winner([15.4, 40.0], [60.0, 70.0])  # one fast step of the slower side does not decide
    assert not clear_winner([10.0], [19.9])
    assert not clear_winner([], [5.0])


@pytest.mark.parametrize("placement", ["learner", "actor"])
def test_a_learner_probe_of_a_distillation_config_times_a_real_step(tmp_path: Path, placement: str) -> None:
    """The tuner's learner probe builds the config's learner: with the teacher on the learner the policy stands in
    for it, with a teacher engine the synthetic groups carry teacher log-probs as an actor's would."""
    from async_rl.learner import local_context

    params = {
        "config": [],
        "overrides": [
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2",
            "distillation.enabled=true",
            "distillation.teacher_model.model_path=builtin:tiny-arith",
            f"distillation.teacher_model.placement={placement}",
            "distillation.distillation_loss.loss_mode=k1",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        ],
        "response_lengths": [3, 5],
    }
    cfg = probes._config(params)
    model_path, records = probes._model_and_records(cfg, tmp_path)
    bench = probes._Bench(params, local_context(), model_path, records, vocab=50, minis_per_step=1)
    groups, prompts, _ = bench.batch(cfg, 4)
    learner = bench.build(cfg)
    assert (learner.teacher is not None) == (placement == "learner")
    assert all((c.teacher_logprobs is not None) == (placement == "actor") for g in groups for c in g.completions)
    assert probes._timed_step(bench.ctx, learner, groups, prompts) > 0


class _TimedEngine:
    """A fake generation engine: each ``generate`` call takes ``seconds`` and returns ``n`` completions of
    ``length`` tokens; ``calls`` records which engine ran, in order (shared between engines)."""

    def __init__(self, name: str, seconds: float, length: int, calls: list[str]) -> None:
        self.name, self.seconds, self.length, self.calls = name, seconds, length, calls
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        self.stopped = True

    async def generate(self, prompt: list[int], sampling: Any) -> list[SimpleNamespace]:
        import asyncio

        self.calls.append(self.name)
        await asyncio.sleep(self.seconds)
        return [SimpleNamespace(token_ids=[1] * self.length) for _ in range(sampling.n)]


def test_keep_in_flight_measures_tokens_per_second_and_refuses_no_tokens() -> None:
    import asyncio

    calls: list[str] = []
    sampling = SimpleNamespace(n=2)
    engine = _TimedEngine("a", 0.02, 5, calls)
    rate, lengths = asyncio.run(probes.keep_in_flight(engine, sampling, lambda: [1, 2], 3, 0.2))
    # 3 groups in flight, each call 0.02 s for 2 x 5 tokens: about 3 x 10 / 0.02 = 1,500 tokens/s
    assert 900 < rate < 1600
    assert set(lengths) == {5} and len(lengths) == 2 * len(calls)
    empty = _TimedEngine("b", 0.01, 0, calls)
    with pytest.raises(ProbeError, match="no token generated .* at 2 groups in flight"):
        asyncio.run(probes.keep_in_flight(empty, sampling, lambda: [1], 2, 0.05))


def test_dtype_rounds_alternate_which_engine_goes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    calls: list[str] = []
    engines = {"float32": _TimedEngine("float32", 0.02, 4, calls), "bfloat16": _TimedEngine("bfloat16", 0.01, 4, calls)}
    turns: list[tuple[str, float]] = []

    async def fake_keep(engine: Any, sampling: Any, next_prompt: Any, groups: int, seconds: float, *a: Any) -> Any:
        turns.append((engine.name, seconds))
        return (100.0 if engine.name == "float32" else 250.0), [4, 4]

    monkeypatch.setattr(probes, "keep_in_flight", fake_keep)
    params = {"groups": 2, "seconds": 1.5, "rounds": 3}
    rates, lengths = asyncio.run(probes.dtype_rounds(engines, SimpleNamespace(n=2), lambda: [1], params))
    # a 2 s warm-up on each, then rounds whose first engine goes last in the next
    assert turns == [
        ("float32", 2.0),
        ("bfloat16", 2.0),
        ("float32", 1.5),
        ("bfloat16", 1.5),
        ("bfloat16", 1.5),
        ("float32", 1.5),
        ("float32", 1.5),
        ("bfloat16", 1.5),
    ]
    assert rates == {"float32": [100.0] * 3, "bfloat16": [250.0] * 3}
    assert lengths == [4] * 12  # the timed rounds' lengths only


def test_rollout_dtype_trial_reports_seconds_per_steps_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo config sets rollout.dtype float32: the trial compares it with bfloat16 and reports the seconds one
    step's tokens (train_batch_size x n x mean length) take at each round's rate; bf16 2.5x faster here."""
    import asyncio

    from async_rl.runtime import actor_main
    from async_rl.tuning.profile import knob_trial
    from async_rl.tuning.settings import choose

    calls: list[str] = []
    built: list[_TimedEngine] = []

    def fake_build(cfg: Any, model_path: str) -> _TimedEngine:
        dtype = cfg.actor_rollout_ref.rollout.dtype
        built.append(_TimedEngine(dtype, 0.025 if dtype == "float32" else 0.01, 6, calls))
        return built[-1]

    records = [SimpleNamespace(token_ids=[3, 4, 5])]
    monkeypatch.setattr(actor_main, "build_engine", fake_build)
    monkeypatch.setattr(probes, "_model_and_records", lambda cfg, workdir: ("model", records))
    monkeypatch.setattr(probes, "keep_in_flight", _fixed_rates({"float32": 200.0, "bfloat16": 500.0}))
    params = {"config": ["configs/demo_grpo.yaml"], "workdir": "unused", "groups": 2, "seconds": 0.1, "rounds": 2}
    result = asyncio.run(probes._rollout_dtype(params))
    cfg = probes._config(params)
    tokens = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n * 6
    assert result == {
        "key": "actor_rollout_ref.rollout.dtype",
        "values": ["float32", "bfloat16"],
        "times_s": [[tokens / 200.0] * 2, [tokens / 500.0] * 2],
        "tokens": tokens,
        "generation": True,
    }
    assert [e.name for e in built] == ["float32", "bfloat16"] and all(e.started and e.stopped for e in built)
    choice = choose(knob_trial(result))
    assert (choice.value, choice.changed) == ("bfloat16", True)
    assert choice.line() == (
        f"set actor_rollout_ref.rollout.dtype=bfloat16 (measured {tokens / 500.0:.3g} s vs {tokens / 200.0:.3g} s per"
        f" step's generation: dtype=bfloat16 vs dtype=float32, {tokens} tokens, medians of 2 and 2 rounds)"
    )


def _fixed_rates(rates: dict[str, float]) -> Callable[..., Any]:
    async def keep(engine: Any, sampling: Any, next_prompt: Any, groups: int, seconds: float, *a: Any) -> Any:
        return rates[engine.name], [6] * sampling.n

    return keep


def test_a_float16_rollout_has_no_dtype_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    params = {"config": ["configs/demo_grpo.yaml"], "overrides": ["actor_rollout_ref.rollout.dtype=float16"]}
    params |= {"workdir": "unused", "groups": 1, "seconds": 0.1, "rounds": 1}
    monkeypatch.setattr(probes, "_model_and_records", lambda cfg, workdir: pytest.fail("no engine needed"))
    assert asyncio.run(probes._rollout_dtype(params)) is None


def test_the_tuner_runs_the_actor_precision_probe_and_reads_its_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from async_rl.tuning import profile

    ran: list[list[str]] = []
    report: dict[str, Any] | None = {
        "key": "actor_rollout_ref.rollout.dtype",
        "values": ["bfloat16", "float32"],
        "times_s": [[6.7, 6.3, 6.7], [10.9, 10.7, 11.1]],
        "tokens": 1747,
        "generation": True,
    }

    def fake_run(cmds: list[list[str]], logs: list[Path], timeout_s: float, env: Any) -> None:
        ran.extend(cmds)
        Path(cmds[0][cmds[0].index("--out") + 1]).write_text(json.dumps(report))

    monkeypatch.setattr(profile, "_run", fake_run)
    opts = MeasureOptions(gen_seconds=4.0, trial_rounds=3)
    trial = profile.actor_precision_trial({"config": ["c.yaml"], "groups": 16}, tmp_path, opts, {})
    assert trial is not None and trial.generation and trial.values == ("bfloat16", "float32")
    assert trial.labels == ("dtype=bfloat16", "dtype=float32") and trial.tokens == 1747
    cmd = ran[0]
    assert cmd[cmd.index("async_rl.tuning.probes") + 1] == "rollout_dtype"
    assert json.loads(cmd[cmd.index("--params") + 1]) == {
        "config": ["c.yaml"],
        "groups": 16,
        "seconds": 4.0,
        "rounds": 3,
    }
    # a float16 rollout: the probe reports null and there is no trial; with --reuse-probes the saved report is read
    report = None
    assert profile.actor_precision_trial({"groups": 1}, tmp_path, opts, {}) is None
    assert profile.actor_precision_trial({}, tmp_path, MeasureOptions(reuse=True), {}) is None and len(ran) == 2


@pytest.mark.slow
def test_the_actor_precision_probe_times_two_real_vllm_engines(tmp_path: Path) -> None:
    """The probe as the tuner starts it (its own process, the probes' environment) on the demo config: two real vLLM
    engines, float32 (the config's) and bfloat16, one short round each; the report is a trial of the rollout dtype."""
    from async_rl.tuning.profile import knob_trial

    out = tmp_path / "rollout-dtype.json"
    params = {"config": ["configs/demo_grpo.yaml"], "overrides": [], "workdir": str(tmp_path / "model")}
    params |= {"groups": 4, "seconds": 0.5, "rounds": 1, "timeout_s": 600}
    cmd = [sys.executable, "-m", "async_rl.tuning.probes", "rollout_dtype", "--params", json.dumps(params)]
    _run([[*cmd, "--out", str(out)]], [tmp_path / "probe.log"], 600, probe_env("system", os.environ))
    report = json.loads(out.read_text())
    assert report["key"] == "actor_rollout_ref.rollout.dtype" and report["generation"] is True
    assert report["values"] == ["float32", "bfloat16"]
    (fp32,), (bf16,) = report["times_s"]
    assert fp32 > 0 and bf16 > 0 and report["tokens"] > 0
    log = (tmp_path / "probe.log").read_text()
    assert "actor precision: round 1, rollout dtype float32:" in log and "rollout dtype bfloat16:" in log
    trial = knob_trial(report)
    assert trial.labels == ("dtype=float32", "dtype=bfloat16") and trial.times_s == ((fp32,), (bf16,))
