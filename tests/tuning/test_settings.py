"""Learner setting recommendations from timed trials: the faster value wins, the config's own value unless the other
beats it by more than the margin; the trials built from the probes' reports."""

from __future__ import annotations

import pytest

from async_rl.tuning.probes import ProbeError
from async_rl.tuning.profile import (
    Profile,
    SettingTrial,
    SharedCompute,
    drift_warning,
    knob_trial,
    layout_trial,
    shared_compute,
)
from async_rl.tuning.settings import SWITCH_MARGIN, choose, choose_settings, settings_lines

PRECISION = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
SHARED = "actor_rollout_ref.model.use_shared_prompt"


def precision(fp32: tuple[float, ...], bf16: tuple[float, ...], incumbent: str = "fp32") -> SettingTrial:
    times = {"fp32": fp32, "bf16": bf16}
    other = "bf16" if incumbent == "fp32" else "fp32"
    return SettingTrial(
        PRECISION,
        (incumbent, other),
        (f"param_dtype={incumbent}", f"param_dtype={other}"),
        (times[incumbent], times[other]),
        1000,
    )


def test_bf16_only_when_its_step_was_faster() -> None:
    # an AVX2 host: bf16 emulated, 2.87 s against fp32's 2.25 s (medians) -> keep fp32
    slow = choose(precision(fp32=(2.2, 2.25, 2.3), bf16=(2.8, 2.87, 3.1)))
    assert (slow.value, slow.chosen_s, slow.other_s, slow.changed) == ("fp32", 2.25, 2.87, False)
    # a native-bf16 host, the config set to fp32: the same step timed 2.0 s in fp32 vs 0.85 s in bf16
    fast = choose(precision(fp32=(2.0, 2.1, 1.9), bf16=(0.85, 0.9, 0.8)))
    assert (fast.value, fast.chosen_s, fast.other_s, fast.changed) == ("bf16", 0.85, 2.0, True)
    # bf16 faster, but by 3% (< the 5% margin): too close to tell on a few steps -> keep the config's fp32
    assert SWITCH_MARGIN == 0.05
    close = choose(precision(fp32=(1.0,), bf16=(0.97,)))
    assert (close.value, close.chosen_s, close.other_s) == ("fp32", 1.0, 0.97)
    assert choose(precision(fp32=(1.0,), bf16=(0.94,))).value == "bf16"  # 6% faster: switch


def test_a_native_bf16_incumbent_stays_unless_fp32_is_faster() -> None:
    # param_dtype auto resolved to bf16 here (values[0] = bf16): fp32 slower -> keep bf16; fp32 much faster -> fp32
    assert choose(precision(fp32=(3.0, 3.2), bf16=(1.3, 1.2), incumbent="bf16")).value == "bf16"
    flipped = choose(precision(fp32=(1.0, 1.0), bf16=(2.0, 2.2), incumbent="bf16"))
    assert (flipped.value, flipped.chosen_s, flipped.other_s) == ("fp32", 1.0, 2.1)


def test_the_line_says_set_key_value_with_both_measurements() -> None:
    fast = choose(precision(fp32=(2.0, 2.1, 1.9), bf16=(0.85, 0.9, 0.8)))
    assert fast.line() == (
        f"set {PRECISION}=bf16 (measured 0.85 s vs 2 s per learner step: param_dtype=bf16 vs param_dtype=fp32,"
        " 1000 tokens, medians of 3 and 3 steps)"
    )
    kept = choose(precision(fp32=(1.0,), bf16=(0.97,)))
    assert kept.line() == (
        f"set {PRECISION}=fp32 (measured 1 s vs 0.97 s per learner step: param_dtype=fp32 vs param_dtype=bf16,"
        " 1000 tokens, medians of 1 and 1 steps; the config's value here, the other within 5%)"
    )
    slow = choose(precision(fp32=(2.25,), bf16=(2.87,)))
    assert slow.line().endswith("medians of 1 and 1 steps; the config's value here)")


def test_knob_trial_from_the_probe_report_and_shared_prompts() -> None:
    report = {"key": SHARED, "values": ["true", "false"], "times_s": [[21.2, 22.0], [50.4, 49.0]], "tokens": 2010}
    trial = knob_trial(report)
    assert trial == SettingTrial(
        SHARED,
        ("true", "false"),
        ("use_shared_prompt=true", "use_shared_prompt=false"),
        ((21.2, 22.0), (50.4, 49.0)),
        2010,
    )
    choice = choose(trial)
    assert (choice.value, choice.chosen_s, choice.other_s) == ("true", 21.6, 49.7)
    with pytest.raises(ProbeError, match=rf"setting trial {SHARED}=false: 0 step\(s\) recorded, 1 needed"):
        knob_trial({**report, "times_s": [[21.2], []]})


def _run(
    ws: int, threads: int, times: list[float], beside: list[float] | None = None, bound: bool = False
) -> dict[str, object]:
    points = [
        {"groups": 8, "tokens": 500, "step_s": 9.0, "all_s": [9.0]},
        {"groups": 16, "tokens": 1000, "step_s": sorted(times)[len(times) // 2], "all_s": times},
    ]
    run: dict[str, object] = {"world_size": ws, "threads": threads, "points": points}
    if beside is not None:  # the probe was paired with generation: its steps beside it
        run["contended_all_s"], run["contended_step_s"] = beside, sorted(beside)[len(beside) // 2]
        run["contended_lower_bound"] = bound
    return run


def test_layout_trial_compares_ranks_and_threads_at_the_full_batch() -> None:
    # the SmolLM2 recipe's first measurement (docs/architecture.md): 2 x 1 medians ~35-39 s, 1 x 2 ~28-29 s
    runs = {2: _run(2, 1, [39.1, 34.7, 40.0]), 1: _run(1, 2, [29.3, 28.5, 30.0])}
    trial = layout_trial(runs, configured=2, groups=16)
    assert trial == SettingTrial(
        "trainer.n_gpus_per_node",
        ("2", "1"),
        ("2 ranks x 1 thread, alone", "1 rank x 2 threads, alone"),
        ((39.1, 34.7, 40.0), (29.3, 28.5, 30.0)),
        1000,
    )
    choice = choose(trial)
    assert (choice.value, choice.chosen_s, choice.other_s) == ("1", 29.3, 39.1)
    assert choice.line().startswith(
        "set trainer.n_gpus_per_node=1 (measured 29.3 s vs 39.1 s per learner step: 1 rank x 2 threads, alone vs 2"
        " ranks x 1 thread, alone,"
    )
    # configured as 1 rank: that is the incumbent; a GPU config's 8 ranks is neither, so 2 ranks is
    assert layout_trial(runs, configured=1, groups=16).values == ("1", "2")  # type: ignore[union-attr]
    assert layout_trial(runs, configured=8, groups=16).values == ("2", "1")  # type: ignore[union-attr]
    assert layout_trial({2: runs[2]}, configured=2, groups=16) is None  # one world size measured: nothing to compare


def test_layout_trial_compares_the_layouts_beside_generation_where_both_were_timed_there() -> None:
    # the Zen 4 host's tuner run (docs/tuning.md): alone 1 x 2 stepped faster, beside the actor's generation 2 x 1 did
    runs = {
        2: _run(2, 1, [12.6, 12.5, 12.8], beside=[26.4, 25.0]),
        1: _run(1, 2, [11.9, 11.8, 12.0], beside=[31.0, 33.5]),
    }
    trial = layout_trial(runs, configured=2, groups=16)
    assert trial is not None and trial.times_s == ((26.4, 25.0), (31.0, 33.5))
    assert trial.labels == ("2 ranks x 1 thread, beside generation", "1 rank x 2 threads, beside generation")
    choice = choose(trial)
    assert (choice.value, choice.chosen_s, choice.other_s, choice.changed) == ("2", 25.7, 32.25, False)
    # only one world size timed beside generation (an older profile): both compared alone, where 1 x 2 wins
    runs[1].pop("contended_all_s")
    alone = layout_trial(runs, configured=2, groups=16)
    assert alone is not None and alone.times_s == ((12.6, 12.5, 12.8), (11.9, 11.8, 12.0))
    assert alone.labels[1] == "1 rank x 2 threads, alone" and choose(alone).value == "1"


def test_choose_settings_on_a_profile(tuner_profile: Profile) -> None:
    assert settings_lines(tuner_profile) == [
        "no learner setting was timed in this profile (profiled before setting trials): profile again"
    ]
    trials = (
        precision(fp32=(2.25,), bf16=(2.87,)),
        knob_trial({"key": SHARED, "values": ["true", "false"], "times_s": [[1.0], [2.44]], "tokens": 10}),
    )
    profile = Profile(**{**tuner_profile.__dict__, "settings": trials})
    assert [c.value for c in choose_settings(profile)] == ["fp32", "true"]
    assert [line.split(" (")[0] for line in settings_lines(profile)] == [f"set {PRECISION}=fp32", f"set {SHARED}=true"]


def test_every_recommended_line_is_a_valid_config_override() -> None:
    # the keys the trials time and the values they recommend load as overrides and land where the learner reads them
    from async_rl.config import load_config
    from async_rl.tuning.probes import KNOBS
    from async_rl.tuning.profile import LAYOUT_KEY

    assert sorted(KNOBS) == [PRECISION, SHARED] and LAYOUT_KEY == "trainer.n_gpus_per_node"
    bf16 = load_config(None, [f"{PRECISION}=bf16"])
    assert bf16.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "bf16"
    assert load_config(None, [f"{SHARED}=false"]).actor_rollout_ref.model.use_shared_prompt is False
    assert load_config(None, [f"{LAYOUT_KEY}=2"]).trainer.n_gpus_per_node == 2
    assert KNOBS[PRECISION].other("fp32") == "bf16" and KNOBS[SHARED].other("false") == "true"


def test_a_learner_timed_twice_far_apart_is_a_warning() -> None:
    # measured on this host while another job ran: the world-1 probe's steps on 32 groups took 8.3-9.6 s, the same
    # step 0.14-0.22 s a minute later as the incumbent of the setting trials (medians 8.674 s and 0.1485 s)
    run = _run(1, 2, [2.5, 2.4, 6.9])
    run["points"][0]["groups"], run["points"][0]["all_s"] = 32, [8.275, 9.636, 8.674]  # type: ignore[index]
    run["trials"] = [{"times_s": [[0.22, 0.194, 0.147], [1.0, 0.94, 0.79]]}, {"times_s": [[0.15, 0.146, 0.144], [0.2]]}]
    warning = drift_warning(run, 32)
    assert warning is not None and warning.startswith(
        "the learner's step at world size 1 on 32 groups took 8.67 s in its timed steps and 0.148 s in the setting"
        " trials: the machine's speed changed while profiling"
    )
    run["points"][0]["all_s"] = [0.184, 0.186, 0.178]  # type: ignore[index]
    assert drift_warning(run, 32) is None  # the quiet run: 0.184 vs 0.1485 s, 1.24x apart (< 1.5)
    assert drift_warning({**run, "trials": []}, 32) is None  # no trials, nothing to compare


def test_a_lower_bound_beside_generation_decides_only_when_it_exceeds_the_other_side() -> None:
    # SmolLM2 on the Zen 4 host (docs/tuning.md): 2 x 1 stepped 18.2-19.0 s beside generation; no 1 x 2 step ended
    full = _run(2, 1, [11.3, 11.8, 11.4], beside=[19.0, 18.2])
    starved = {2: full, 1: _run(1, 2, [11.5, 11.6, 11.5], beside=[160.0], bound=True)}
    trial = layout_trial(starved, configured=2, groups=16)
    assert trial is not None and trial.times_s == ((19.0, 18.2), (160.0,))
    assert trial.labels[1] == "1 rank x 2 threads, beside generation (at least: no step ended there)"
    assert choose(trial).value == "2"
    # a bound under the other side's slowest step says nothing: both compared alone
    unsure = {2: full, 1: _run(1, 2, [11.5, 11.6, 11.5], beside=[18.5], bound=True)}
    alone = layout_trial(unsure, configured=2, groups=16)
    assert alone is not None and alone.times_s == ((11.3, 11.8, 11.4), (11.5, 11.6, 11.5))
    assert alone.labels == ("2 ranks x 1 thread, alone", "1 rank x 2 threads, alone")


def test_shared_compute_from_the_paired_probes_of_the_real_model() -> None:
    # SmolLM2's recipe on the Zen 4 host (docs/tuning.md): generation 269.4 tokens/s alone at 128 sequences, 228.2
    # beside the learner; the 2-rank learner 11.36 s a step alone at 16 groups, 18.2 and 19.0 s beside generation
    gen = {"sequences_in_flight": [8, 32, 128], "tokens_per_s": [164.7, 258.0, 269.4], "contended_tokens_per_s": 228.2}
    run = _run(2, 1, [11.27, 11.36, 11.79], beside=[19.0, 18.2])
    run["contended_step_s"] = 18.6
    assert shared_compute(gen, run, 16, 128) == SharedCompute(
        generation_factor=pytest.approx(228.2 / 269.4), train_factor=pytest.approx(11.36 / 18.6)
    )
    assert shared_compute({**gen, "contended_tokens_per_s": None}, run, 16, 128) is None
    assert shared_compute(gen, _run(2, 1, [11.36]), 16, 128) is None  # the learner probe was not paired
