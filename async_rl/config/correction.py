"""``algorithm.rollout_correction``: verl 0.9.1's keys, this project's earlier names as aliases, and their rules.

verl's keys are the primary spelling, with verl's meaning:

- ``rollout_is``: importance-weight level, ``token`` or ``sequence`` (plus this project's ``geometric``); null = no
  weights. The default here is ``token`` (verl's is null): every sample of an asynchronous run is off-policy.
- ``rollout_is_threshold``: a number = truncate the weights at it (TIS); a ``"lower_upper"`` string = zero the
  weights outside ``[lower, upper]`` (IcePop / masked IS).
- ``rollout_is_batch_normalize``: divide the weights by their mean over the training batch.
- ``rollout_rs`` / ``rollout_rs_threshold``: rejection sampling; tokens or whole sequences whose divergence statistic
  is out of bounds leave the loss (see :data:`RS_OPTIONS`).
- ``bypass_mode`` / ``loss_type``: skip the proximal-policy pass and take the actor's log-probs as the old policy;
  ``ppo_clip`` then clips pi/pi_rollout with no extra weights, ``reinforce`` is ``-w * A * log pi``.

The aliases (``enable``, ``is_level``, ``is_mode``, ``is_threshold``, ``is_threshold_lower``) are folded into
verl's keys by :func:`resolve_rollout_correction`; setting an alias and a verl key to different meanings is an
error. This module is torch-free (config validation must not import torch); the learner parses the same strings
with :func:`parse_is_threshold` / :func:`parse_rs_spec`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from async_rl.config.algorithm import RolloutCorrectionConfig

RS_OPTIONS: tuple[str, ...] = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
"""verl 0.9.1's rejection-sampling options: ``<level>_<estimator>``; k1 = -log r (ratio bounds ``lower_upper``),
k2 = (log r)^2 / 2 and k3 = r - 1 - log r (upper bounds only), r = pi_old / pi_rollout per token."""

_KEY = "algorithm.rollout_correction"


def _parse_float(name: str, text: str, spec: object) -> float:
    # float() would read "5_6" as 56 (PEP 515 digit grouping), so "0.5_5_6" would silently mean (0.5, 56) -- as it
    # does in verl. Any further underscore is rejected instead.
    try:
        if "_" in text:
            raise ValueError(text)
        return float(text)
    except ValueError:
        raise ValueError(f"{name} {spec!r} is not a number or a 'lower_upper' pair of numbers") from None


def parse_is_threshold(threshold: float | str) -> tuple[float, float | None]:
    """Parse an IS threshold spec into ``(upper, lower)``; ``lower is None`` means TIS, otherwise IcePop.

    A number or a number-like string (``2.0``, ``"2.0"``) is a TIS cap: ``(2.0, None)``. ``"lower_upper"`` (e.g.
    ``"0.5_5.0"``) gives IcePop bounds ``(5.0, 0.5)``. ``ValueError`` (naming ``threshold``) for a bool, another type,
    an empty or non-numeric string, more than one ``_``, ``upper <= 0`` (or NaN) and unless ``0 < lower <= upper``
    (verl 0.9.1 ``_parse_rollout_is_threshold``, which raises ``TypeError`` for the type errors and reads
    ``"0.5_5_6"`` as ``(56.0, 0.5)`` through Python's digit grouping).
    """
    if isinstance(threshold, bool):
        raise ValueError(f"threshold must be a number or a string such as '2.0' or '0.5_5.0', not a bool ({threshold})")
    lower: float | None = None
    if isinstance(threshold, (int, float)):
        upper = float(threshold)
    elif isinstance(threshold, str):
        spec = threshold.strip()
        if not spec:
            raise ValueError("threshold must not be an empty string")
        if "_" in spec:
            lower_text, upper_text = spec.split("_", 1)
            lower = _parse_float("threshold", lower_text, threshold)
            upper = _parse_float("threshold", upper_text, threshold)
        else:
            upper = _parse_float("threshold", spec, threshold)
    else:
        raise ValueError(f"threshold must be a number or a string, got {type(threshold).__name__}")
    if not upper > 0:
        raise ValueError(f"threshold upper bound must be > 0, got {upper!r} (from {threshold!r})")
    if lower is not None and not 0 < lower <= upper:
        raise ValueError(f"threshold lower bound must satisfy 0 < lower <= upper, got {threshold!r}")
    return upper, lower


def parse_rs_options(options: str) -> tuple[str, ...]:
    """Split a comma-separated rejection spec (``"token_k1,seq_mean_k3"``) into known option names, in order.

    Whitespace around names is ignored and repeats are dropped. ``ValueError`` (naming ``options``) for a non-string,
    an empty list or an unknown name (listing the allowed ones).
    """
    if not isinstance(options, str):
        raise ValueError(f"options must be a comma-separated string of rejection options, got {options!r}")
    names = [part.strip() for part in options.split(",") if part.strip()]
    if not names:
        raise ValueError("options must name at least one rejection option")
    for name in names:
        if name not in RS_OPTIONS:
            raise ValueError(f"options entry {name!r} is not one of {', '.join(RS_OPTIONS)}")
    return tuple(dict.fromkeys(names))


def parse_rs_thresholds(options: Sequence[str], thresholds: str | float) -> dict[str, tuple[float | None, float]]:
    """Per-option ``(lower, upper)`` bounds from ``thresholds``: one spec for all options or one per option.

    ``thresholds`` is a number or a comma-separated string with 1 or ``len(options)`` entries. For ``*_k1`` options an
    entry is ``"lower_upper"`` (bounds on a probability ratio, compared in log space) or a single ``upper`` with
    ``lower = 1 / upper``; both must be > 0 with ``lower <= upper``. Every other option takes a single upper bound
    ``> 0`` (no ``_``) and has ``lower = None``. ``ValueError`` naming ``thresholds`` otherwise.
    """
    if isinstance(thresholds, bool) or not isinstance(thresholds, (int, float, str)):
        raise ValueError(f"thresholds must be a number or a comma-separated string, got {thresholds!r}")
    specs = [str(thresholds)] if not isinstance(thresholds, str) else [p.strip() for p in thresholds.split(",")]
    specs = [s for s in specs if s]
    if not specs:
        raise ValueError("thresholds must contain at least one value")
    if len(specs) not in (1, len(options)):
        raise ValueError(
            f"thresholds has {len(specs)} entries; give one shared by all options or exactly {len(options)} "
            f"(one per option of {list(options)})"
        )
    if len(specs) == 1:
        specs = specs * len(options)
    bounds: dict[str, tuple[float | None, float]] = {}
    for option, spec in zip(options, specs, strict=True):
        name = f"thresholds entry for {option}"
        if option.endswith("k1"):
            if "_" in spec:
                lower_text, upper_text = spec.split("_", 1)
                lower = _parse_float(name, lower_text, spec)
                upper = _parse_float(name, upper_text, spec)
            else:
                upper = _parse_float(name, spec, spec)
                if not upper > 0:
                    raise ValueError(f"{name} must be > 0, got {spec!r}")
                lower = 1.0 / upper
            if not (lower > 0 and upper > 0):
                raise ValueError(f"{name} must have positive bounds, got {spec!r}")
            if lower > upper:
                raise ValueError(f"{name} must satisfy lower <= upper, got {spec!r}")
            bounds[option] = (lower, upper)
        else:
            if "_" in spec:
                raise ValueError(f"{name} takes a single upper bound (no 'lower_upper'), got {spec!r}")
            upper = _parse_float(name, spec, spec)
            if not upper > 0:
                raise ValueError(f"{name} must be > 0, got {spec!r}")
            bounds[option] = (None, upper)
    return bounds


def parse_rs_spec(options: str, thresholds: str | float | None) -> dict[str, tuple[float | None, float]]:
    """``rollout_rs`` with ``rollout_rs_threshold`` -> ``{option: (lower, upper)}`` in option order (see above)."""
    names = parse_rs_options(options)
    if thresholds is None:
        raise ValueError("thresholds must be given for rejection sampling (rollout_rs_threshold)")
    return parse_rs_thresholds(names, thresholds)


def _alias_threshold(rc: RolloutCorrectionConfig) -> float | str | None:
    """The ``rollout_is_threshold`` spelled by the alias keys, or None when none of them is set."""
    if rc.is_threshold is None and rc.is_mode is None and rc.is_threshold_lower is None:
        return None
    upper = rc.is_threshold if rc.is_threshold is not None else parse_is_threshold(rc.rollout_is_threshold)[0]
    if rc.is_mode == "mask":
        lower = rc.is_threshold_lower if rc.is_threshold_lower is not None else 1.0 / upper
        return f"{lower:g}_{upper:g}"
    return float(upper)


def check_rollout_correction(rc: RolloutCorrectionConfig, default: RolloutCorrectionConfig, errors: list[str]) -> None:
    """Append one line per violated rule (bad strings, alias conflicts) to ``errors``."""
    try:
        parse_is_threshold(rc.rollout_is_threshold)
    except ValueError as exc:
        errors.append(f"{_KEY}.rollout_is_threshold={rc.rollout_is_threshold!r}: {exc}")
    if rc.rollout_rs is not None:
        try:
            parse_rs_spec(rc.rollout_rs, rc.rollout_rs_threshold)
        except ValueError as exc:
            errors.append(
                f"{_KEY}.rollout_rs={rc.rollout_rs!r} / rollout_rs_threshold={rc.rollout_rs_threshold!r}: {exc}"
            )
    elif rc.rollout_rs_threshold is not None:
        errors.append(f"{_KEY}.rollout_rs_threshold is set but {_KEY}.rollout_rs is null (name the options)")
    if rc.is_threshold is not None and rc.is_threshold < 1.0:
        errors.append(f"{_KEY}.is_threshold must be >= 1 (a cap on pi_old / pi_rollout), got {rc.is_threshold}")
    if rc.is_threshold_lower is not None:
        upper = rc.is_threshold if rc.is_threshold is not None else 2.0
        if rc.is_threshold_lower >= upper:
            errors.append(
                f"{_KEY}.is_threshold_lower ({rc.is_threshold_lower}) must be < {_KEY}.is_threshold ({upper})"
            )
    level_changed = rc.rollout_is != default.rollout_is
    if rc.is_level is not None and level_changed and rc.is_level != rc.rollout_is:
        errors.append(
            f"{_KEY}.is_level ({rc.is_level!r}) conflicts with its verl spelling {_KEY}.rollout_is"
            f" ({rc.rollout_is!r}); set only one"
        )
    if rc.enable is False and rc.is_level is not None:
        errors.append(f"{_KEY}.enable=false turns the weights off, but {_KEY}.is_level is set ({rc.is_level!r})")
    if rc.enable is True and rc.rollout_is is None and level_changed:
        errors.append(f"{_KEY}.enable=true conflicts with {_KEY}.rollout_is=null; set only one")
    alias = _alias_threshold(rc) if not errors else None
    if alias is not None and rc.rollout_is_threshold != default.rollout_is_threshold:
        same = parse_is_threshold(alias) == parse_is_threshold(rc.rollout_is_threshold)
        if not same:
            errors.append(
                f"{_KEY}.is_threshold/is_mode/is_threshold_lower spell rollout_is_threshold={alias!r}, which conflicts"
                f" with {_KEY}.rollout_is_threshold ({rc.rollout_is_threshold!r}); set only one spelling"
            )
    if rc.loss_type != default.loss_type and not rc.bypass_mode:
        errors.append(f"{_KEY}.loss_type={rc.loss_type!r} is used only with {_KEY}.bypass_mode=true")


def resolve_rollout_correction(rc: RolloutCorrectionConfig) -> None:
    """Fold the alias keys into verl's (in place, idempotent); the aliases are left null."""
    alias = _alias_threshold(rc)
    if alias is not None:
        rc.rollout_is_threshold = alias
    if rc.is_level is not None:
        rc.rollout_is = rc.is_level
    if rc.enable is False:
        rc.rollout_is = None
    elif rc.enable is True and rc.rollout_is is None:
        rc.rollout_is = "token"
    rc.enable = rc.is_level = rc.is_mode = rc.is_threshold = rc.is_threshold_lower = None
    if isinstance(rc.rollout_is_threshold, str) and "_" not in rc.rollout_is_threshold:
        rc.rollout_is_threshold = float(rc.rollout_is_threshold)


__all__ = [
    "RS_OPTIONS",
    "check_rollout_correction",
    "parse_is_threshold",
    "parse_rs_options",
    "parse_rs_spec",
    "parse_rs_thresholds",
    "resolve_rollout_correction",
]
