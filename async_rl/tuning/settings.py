"""Settings for the profiled host, chosen from the setting trials the probes timed (no model of the hardware).

Each :class:`~async_rl.tuning.profile.SettingTrial` timed the same work at two values of one config key (the
learner's step on one batch, or for the actor's rollout dtype rounds of generation): the config's own value as it
ran here (``values[0]``, the incumbent: ``auto`` resolved) and the other. The recommendation is the faster of the two
by the median time, except that the incumbent stays unless the other was faster by more than :data:`SWITCH_MARGIN`
(a few rounds on a shared machine cannot tell 2% apart). So bf16 is recommended only where it was measurably faster
than fp32, whatever the CPU flags say.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from async_rl.tuning.profile import Profile, SettingTrial

SWITCH_MARGIN = 0.05
"""The other value must beat the incumbent's median step time by more than this fraction to be recommended."""


@dataclass(frozen=True)
class SettingChoice:
    """The value recommended for one trial's key, with both median step times."""

    trial: SettingTrial
    value: str
    chosen_s: float  # median learner step at ``value``
    other_s: float  # ... and at the other value

    @property
    def changed(self) -> bool:
        """Whether the recommendation differs from the config's own value (as it ran here)."""
        return self.value != self.trial.values[0]

    def line(self) -> str:
        """``set key=value (measured X s vs Y s per learner step: ...)``, the form the tuner prints and writes."""
        t = self.trial
        mine, theirs = (1, 0) if self.changed else (0, 1)
        note = ""
        if not self.changed:
            close = self.other_s < self.chosen_s
            note = f"; the config's value here{f', the other within {SWITCH_MARGIN:.0%}' if close else ''}"
        per, unit = ("step's generation", "rounds") if t.generation else ("learner step", "steps")
        return (
            f"set {t.key}={self.value} (measured {self.chosen_s:.3g} s vs {self.other_s:.3g} s per {per}:"
            f" {t.labels[mine]} vs {t.labels[theirs]}, {t.tokens} tokens, medians of {len(t.times_s[mine])} and"
            f" {len(t.times_s[theirs])} {unit}{note})"
        )


def choose(trial: SettingTrial) -> SettingChoice:
    """The recommended value of ``trial.key`` (see the module docstring)."""
    for value, times in zip(trial.values, trial.times_s, strict=True):
        if not times:
            raise ValueError(f"setting trial {trial.key}={value} has no step time")
    incumbent, other = (statistics.median(times) for times in trial.times_s)
    if other < incumbent * (1.0 - SWITCH_MARGIN):
        return SettingChoice(trial, trial.values[1], other, incumbent)
    return SettingChoice(trial, trial.values[0], incumbent, other)


def choose_settings(profile: Profile) -> list[SettingChoice]:
    """One recommendation per setting trial in ``profile`` (none for a profile made before trials were timed)."""
    return [choose(t) for t in profile.settings]


def settings_lines(profile: Profile) -> list[str]:
    """The recommendations as lines, or one line saying why there are none."""
    if not profile.settings:
        return ["no learner setting was timed in this profile (profiled before setting trials): profile again"]
    return [c.line() for c in choose_settings(profile)]
