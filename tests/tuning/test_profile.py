"""Profile JSON round-trip and the fits the simulator uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_rl.tuning.profile import InJob, Profile, SettingTrial
from async_rl.tuning.simulator import SharedCompute


def test_json_round_trip(tuner_profile: Profile, tmp_path: Path) -> None:
    trial = SettingTrial(
        "trainer.n_gpus_per_node", ("2", "1"), ("2 ranks x 1 thread", "1 rank x 2 threads"), ((0.3, 0.32), (0.22,)), 900
    )
    dtype = SettingTrial(
        "actor_rollout_ref.rollout.dtype",
        ("bfloat16", "float32"),
        ("dtype=bfloat16", "dtype=float32"),
        ((2.1, 2.0), (3.4, 3.3)),
        1800,
        generation=True,
    )
    full = Profile(
        **{
            **tuner_profile.__dict__,
            "shared": SharedCompute(0.6, 0.4),
            "calibration": InJob(1.8, 0.07, 0.005),
            "settings": (trial, dtype),
        }
    )
    for p in (tuner_profile, full):
        p.save(tmp_path / "p.json")
        assert Profile.load(tmp_path / "p.json") == p
    assert Profile.load(tmp_path / "p.json").settings[1].generation is True


def test_a_setting_trial_saved_before_actor_trials_is_a_learner_trial() -> None:
    saved = {"key": "k", "values": ["a", "b"], "labels": ["k=a", "k=b"], "times_s": [[1.0], [2.0]], "tokens": 5}
    assert SettingTrial.from_dict(saved) == SettingTrial("k", ("a", "b"), ("k=a", "k=b"), ((1.0,), (2.0,)), 5, False)


def test_a_profile_saved_before_setting_trials_still_loads(tuner_profile: Profile) -> None:
    text = tuner_profile.to_json().replace('\n "settings": [],', "")
    assert '"settings"' not in text
    assert Profile.from_json(text) == tuner_profile and tuner_profile.settings == ()


def test_bad_json_is_refused(tuner_profile: Profile) -> None:
    with pytest.raises(ValueError, match="format"):
        Profile.from_json(tuner_profile.to_json().replace('"format": 1', '"format": 99'))
    with pytest.raises(ValueError, match="unknown"):
        Profile.from_json(tuner_profile.to_json().replace('"cores"', '"corez"'))


def test_learner_and_sync_fits_are_exact_on_two_points(tuner_profile: Profile) -> None:
    one, two = tuner_profile.learner_model(1), tuner_profile.learner_model(2)
    assert one.fixed_s == pytest.approx(0.1) and one.tokens_per_s == pytest.approx(1000.0)
    assert two.fixed_s == pytest.approx(0.1) and two.tokens_per_s == pytest.approx(1800.0)
    assert tuner_profile.sync_s() == pytest.approx(0.05 + 20_000_000 / 100e6)
    with pytest.raises(ValueError, match="world size 4"):
        tuner_profile.learner_model(4)


def test_a_noisy_fit_falls_back_to_proportional(tuner_profile: Profile) -> None:
    from async_rl.tuning.profile import LearnerPoint

    noisy = Profile(
        **{**tuner_profile.__dict__, "learner": (LearnerPoint(2, 4, 1000, 0.5), LearnerPoint(2, 8, 2000, 0.4))}
    )
    m = noisy.learner_model(2)
    assert m.fixed_s == 0.0 and m.tokens_per_s == pytest.approx(3000 / 0.9)
