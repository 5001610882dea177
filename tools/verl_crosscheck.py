"""Cross-check ``async_rl.algorithms`` against verl 0.9.1 on the same random inputs.

Run it in an environment where ``verl`` is importable; verl is *not* a dependency of this repository. A throwaway
environment that works (torch comes from the repository's ``.venv``)::

    python -m venv --system-site-packages /tmp/verlvenv
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/verlvenv/lib/python3.11/site-packages/asyncrl.pth
    /tmp/verlvenv/bin/pip install --no-deps verl-0.9.1-py3-none-any.whl omegaconf antlr4-python3-runtime==4.9.3 \\
        codetiming "tensordict==0.10.0" pyvers
    /tmp/verlvenv/bin/python tools/verl_crosscheck.py

``verl/__init__.py`` imports ``verl.protocol``, which imports ``ray`` at module level; none of the functions checked
here touch ray, so when ray is not installed a tiny stand-in module is registered under that name (``--no-ray-stub``
turns that off). Each item prints the largest absolute difference between our result and verl's and PASS/FAIL
against a float32 tolerance (masks must match exactly); the exit status is 1 if anything failed, 2 if verl could not
be imported.

verl functions that need a config object get the minimal one: ``verl.workers.config.ActorConfig(strategy="fsdp",
rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio*, loss_agg_mode, policy_loss)`` with ``global_batch_info``
set to ``{}`` (local normalisation) or ``{dp_size, batch_num_tokens, global_batch_size, loss_scale_factor}``, and
``verl.trainer.config.AlgoConfig(gamma, lam, norm_adv_by_std_in_grpo)`` for the advantage estimators that read one.
"""

from __future__ import annotations

import argparse
import math
import sys
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl import algorithms as ours  # noqa: E402
from async_rl.config.correction import parse_is_threshold, parse_rs_spec  # noqa: E402

B, T, GROUP = 16, 12, 4


# ------------------------------------------------------------------------------------------------------- plumbing


def _install_ray_stub() -> None:
    """Register a minimal ``ray`` module (only names verl.protocol reads at import or in type hints)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        stub = types.ModuleType("ray")

        class ObjectRef:  # noqa: D401 - a placeholder type
            """Placeholder for ``ray.ObjectRef`` (type hints and isinstance checks only)."""

        def _unavailable(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError("ray is a stub in verl_crosscheck.py")

        stub.ObjectRef = ObjectRef  # type: ignore[attr-defined]
        stub.get = _unavailable  # type: ignore[attr-defined]
        stub.put = _unavailable  # type: ignore[attr-defined]
        stub.remote = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)  # type: ignore[attr-defined]
        stub.is_initialized = lambda: False  # type: ignore[attr-defined]
        sys.modules["ray"] = stub


class Report:
    def __init__(self) -> None:
        self.results: list[tuple[str, bool]] = []

    def close(self, name: str, mine: Any, theirs: Any, tol: float = 1e-5) -> None:
        a = torch.as_tensor(mine, dtype=torch.float64).detach()
        b = torch.as_tensor(theirs, dtype=torch.float64).detach()
        if a.shape != b.shape:
            self._line(name, False, f"shape {tuple(a.shape)} vs verl {tuple(b.shape)}")
            return
        both_nan = torch.isnan(a) & torch.isnan(b)
        diff = torch.where(both_nan, torch.zeros_like(a), (a - b).abs())
        worst = float(diff.max()) if diff.numel() else 0.0
        scale = max(1.0, float(b[~torch.isnan(b)].abs().max())) if (~torch.isnan(b)).any() else 1.0
        ok = math.isfinite(worst) and worst <= tol * scale
        self._line(name, ok, f"max|diff| {worst:.3e}")

    def exact(self, name: str, mine: torch.Tensor, theirs: torch.Tensor) -> None:
        mismatched = int((mine.to(torch.float64) != theirs.to(torch.float64)).sum())
        self._line(name, mismatched == 0, f"{mismatched} of {mine.numel()} positions differ")

    def error(self, name: str, exc: BaseException) -> None:
        self._line(name, False, f"{type(exc).__name__}: {exc}")

    def _line(self, name: str, ok: bool, detail: str) -> None:
        self.results.append((name, ok))
        print(f"{'PASS' if ok else 'FAIL'}  {name:<72} {detail}", flush=True)

    def run(self, name: str, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a crash in one item must not hide the others
            self.error(name, exc)


def _inputs(seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    old = -3.0 * torch.rand(B, T, generator=gen)
    return {
        "gen": gen,
        "mask": mask,
        "old": old,
        "log_prob": old + 0.3 * torch.randn(B, T, generator=gen),
        "rollout": old + 0.3 * torch.randn(B, T, generator=gen),
        "adv": torch.randn(B, T, generator=gen),
        "loss_mat": torch.randn(B, T, generator=gen),
        "index": np.random.default_rng(seed).permutation(np.repeat(np.arange(B // GROUP), GROUP)),
    }


def _actor_config(verl: Any, mode: str, global_info: dict[str, Any] | None = None, **policy: Any) -> Any:
    cfg = verl.ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        loss_agg_mode=mode,
        **({"policy_loss": verl.PolicyLossConfig(**policy)} if policy else {}),
    )
    cfg.global_batch_info.update(global_info or {})
    return cfg


def _verl_metric(metrics: dict[str, Any], key: str) -> float:
    value: Any = metrics.get(f"actor/{key}", metrics.get(key))
    return float(value.item() if isinstance(value, torch.Tensor) else value)


# ---------------------------------------------------------------------------------------------------------- checks


def _compare_agg(rep: Report, label: str, mine: Callable[..., Any], theirs: Callable[..., Any], *args: Any) -> None:
    rep.close(label, mine(*args), theirs(*args))


def check_agg_loss(rep: Report, verl: Any, x: dict[str, Any]) -> None:
    loss_mat = x["loss_mat"]
    mask = x["mask"].clone()
    mask[3] = 0.0  # one fully padded row: seq-mean modes divide by non-empty rows
    rows = slice(0, B // 2)
    tokens, seqs = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    for mode in sorted(ours.LOSS_AGG_MODES):
        label = f"agg_loss {mode} local (one empty row)"
        mine = partial(ours.agg_loss, loss_scale_factor=None)
        rep.run(label, _compare_agg, rep, label, mine, verl.agg_loss, loss_mat, mask, mode)
        for factor in (None, 1024.0):
            label = f"agg_loss {mode} micro-batch, global counts, loss_scale_factor={factor}"

            def _global(mode: str = mode, factor: float | None = factor, label: str = label) -> None:
                mine = ours.agg_loss(
                    loss_mat[rows],
                    mask[rows],
                    mode,
                    global_num_tokens=tokens,
                    global_num_seqs=seqs,
                    loss_scale_factor=factor,
                )
                info = {"batch_num_tokens": tokens, "global_batch_size": seqs, "loss_scale_factor": factor}
                rep.close(label, mine, verl.agg_loss(loss_mat[rows], mask[rows], mode, dp_size=1, **info))
                rep.close(
                    f"agg_loss {mode} dp_size=4: verl == 4 x ours (factor={factor})",
                    4.0 * mine,
                    verl.agg_loss(loss_mat[rows], mask[rows], mode, dp_size=4, **info),
                )

            if mode in ("seq-mean-token-sum-norm",) or factor is None:
                rep.run(label, _global)


def _policy_case(
    rep: Report,
    verl: Any,
    x: dict[str, Any],
    loss_mode: str,
    agg_mode: str,
    weights: torch.Tensor | None,
    label: str,
    global_info: dict[str, Any] | None = None,
) -> None:
    mask = x["mask"]
    lp_ours = x["log_prob"].clone().requires_grad_(True)
    lp_verl = x["log_prob"].clone().requires_grad_(True)
    counts: dict[str, Any] = {"loss_scale_factor": None}
    if global_info:
        counts = {
            "global_num_tokens": global_info["batch_num_tokens"],
            "global_num_seqs": global_info["global_batch_size"],
            "loss_scale_factor": global_info["loss_scale_factor"],
        }
    mine, m_metrics = ours.policy_loss(
        x["old"],
        lp_ours,
        x["adv"],
        mask,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        loss_agg_mode=agg_mode,
        loss_mode=loss_mode,
        is_weights=weights,
        **counts,
    )
    fn = verl.core_algos.get_policy_loss_fn(loss_mode)
    theirs, v_metrics = fn(
        old_log_prob=x["old"],
        log_prob=lp_verl,
        advantages=x["adv"],
        response_mask=mask,
        loss_agg_mode=agg_mode,
        config=_actor_config(verl, agg_mode, global_info),
        rollout_is_weights=weights,
    )
    rep.close(f"{label} loss", mine, theirs)
    mine.backward()
    theirs.backward()
    rep.close(f"{label} d loss / d log_prob", lp_ours.grad, lp_verl.grad)
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        rep.close(f"{label} {key}", m_metrics[key], _verl_metric(v_metrics, key))


def check_policy_losses(rep: Report, verl: Any, x: dict[str, Any]) -> None:
    mask = x["mask"]
    log_ratio = x["old"] - x["rollout"]
    tis, _ = verl.rc.compute_rollout_correction_weights(log_ratio, mask, "token", 2.0)
    icepop, _ = verl.rc.compute_rollout_correction_weights(log_ratio, mask, "token", "0.5_2.0")
    seq_tis, _ = verl.rc.compute_rollout_correction_weights(log_ratio, mask, "sequence", 5.0)
    weight_sets = {"no IS": None, "token TIS 2.0": tis, "token IcePop 0.5_2.0": icepop, "seq TIS 5.0": seq_tis}
    tokens, seqs = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    for loss_mode in ("vanilla", "gspo", "cispo", "geo_mean"):
        agg_modes = ["token-mean"] if loss_mode == "geo_mean" else sorted(ours.LOSS_AGG_MODES)
        for agg_mode in agg_modes:
            for wname, weights in weight_sets.items():
                if agg_mode != "token-mean" and wname not in ("no IS", "token TIS 2.0"):
                    continue
                label = f"{loss_mode} [{agg_mode}, {wname}]"
                rep.run(label, _policy_case, rep, verl, x, loss_mode, agg_mode, weights, label)
        if loss_mode != "geo_mean":
            info = {
                "dp_size": 1,
                "batch_num_tokens": tokens * 2,
                "global_batch_size": seqs * 2,
                "loss_scale_factor": 64,
            }
            for agg_mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
                label = f"{loss_mode} [{agg_mode}, token TIS 2.0, global counts + loss_scale_factor=64]"
                rep.run(label, _policy_case, rep, verl, x, loss_mode, agg_mode, tis, label, info)


def check_reinforce(rep: Report, verl: Any, x: dict[str, Any]) -> None:
    mask = x["mask"]
    log_ratio = x["log_prob"] - x["rollout"]
    weights, _ = verl.rc.compute_rollout_correction_weights(log_ratio, mask, "token", 2.0)
    for agg_mode in ("token-mean", "seq-mean-token-sum"):
        for wname, w in (("no IS", None), ("token TIS 2.0", weights)):
            label = f"reinforce_loss [{agg_mode}, {wname}]"

            def _case(agg_mode: str = agg_mode, w: torch.Tensor | None = w, label: str = label) -> None:
                lp_ours = x["log_prob"].clone().requires_grad_(True)
                lp_verl = x["log_prob"].clone().requires_grad_(True)
                mine, m_metrics = ours.reinforce_loss(
                    lp_ours,
                    x["adv"],
                    mask,
                    is_weights=w,
                    loss_agg_mode=agg_mode,
                    loss_scale_factor=None,
                    rollout_log_prob=x["rollout"],
                )
                theirs, v_metrics = verl.core_algos.compute_policy_loss_reinforce(
                    x["rollout"], lp_verl, x["adv"], mask, agg_mode, _actor_config(verl, agg_mode), w
                )
                rep.close(f"{label} loss", mine, theirs)
                mine.backward()
                theirs.backward()
                rep.close(f"{label} d loss / d log_prob", lp_ours.grad, lp_verl.grad)
                rep.close(f"{label} ppo_kl", m_metrics["ppo_kl"], _verl_metric(v_metrics, "ppo_kl"))

            rep.run(label, _case)

    # verl's bypass_mode with loss_type=reinforce == rollout_is_weights + rejection_mask + reinforce_loss
    label = "bypass_mode(reinforce, token TIS 2.0, token_k1 0.5_2.0) == our composition"

    def _bypass() -> None:
        corr = verl.RolloutCorrectionConfig(
            rollout_is="token",
            rollout_is_threshold=2.0,
            rollout_rs="token_k1",
            rollout_rs_threshold="0.5_2.0",
            bypass_mode=True,
            loss_type="reinforce",
        )
        cfg = _actor_config(verl, "token-mean", loss_mode="bypass_mode", rollout_correction=corr)
        lp_verl = x["log_prob"].clone().requires_grad_(True)
        theirs, _ = verl.core_algos.compute_policy_loss_bypass_mode(
            x["rollout"], lp_verl, x["adv"], mask, "token-mean", cfg
        )
        lp_ours = x["log_prob"].clone().requires_grad_(True)
        w, _ = ours.rollout_is_weights(lp_ours.detach(), x["rollout"], mask, level="token", upper=2.0, lower=None)
        kept, _ = ours.rejection_mask(lp_ours.detach(), x["rollout"], mask, bounds=parse_rs_spec("token_k1", "0.5_2.0"))
        mine, _ = ours.reinforce_loss(
            lp_ours, x["adv"], kept, is_weights=w, loss_agg_mode="token-mean", loss_scale_factor=None
        )
        rep.close(f"{label} loss", mine, theirs)
        mine.backward()
        theirs.backward()
        rep.close(f"{label} grad", lp_ours.grad, lp_verl.grad)

    rep.run(label, _bypass)


def check_advantages(rep: Report, verl: Any, x: dict[str, Any]) -> None:
    gen, mask, index = x["gen"], x["mask"], x["index"]
    lengths = mask.sum(-1).long()
    binary = torch.randint(0, 2, (B,), generator=gen).float()
    continuous = torch.randn(B, generator=gen)
    dense = torch.randn(B, T, generator=gen) * mask
    values = torch.randn(B, T, generator=gen)
    # a masked span inside every response (column 2) and non-zero rewards on padding
    holes = mask.clone()
    holes[:, 2] = 0.0
    holes[:, 0] = 1.0
    noisy = torch.randn(B, T, generator=gen)
    ca = verl.core_algos

    def outcome(scores: torch.Tensor) -> torch.Tensor:
        rewards = torch.zeros(B, T)
        rewards[torch.arange(B), lengths - 1] = scores
        return rewards

    def algo(gamma: float = 1.0, lam: float = 1.0, norm: bool = True) -> Any:
        return verl.AlgoConfig(gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm)

    Thunk = Callable[[], tuple[torch.Tensor, torch.Tensor]]
    cases: list[tuple[str, Thunk, Thunk]] = [
        (
            "gae gamma=0.9 lam=0.95",
            partial(
                ours.compute_advantages,
                "gae",
                token_level_rewards=dense,
                response_mask=mask,
                values=values,
                gamma=0.9,
                lam=0.95,
                norm_adv_by_std_in_grpo=True,
            ),
            partial(ca.compute_gae_advantage_return, dense, values, mask, 0.9, 0.95),
        ),
        (
            "gae (masked span, padding rewards)",
            partial(
                ours.compute_advantages,
                "gae",
                token_level_rewards=noisy,
                response_mask=holes,
                values=values,
                gamma=0.9,
                lam=0.95,
                norm_adv_by_std_in_grpo=True,
            ),
            partial(ca.compute_gae_advantage_return, noisy, values, holes, 0.9, 0.95),
        ),
        (
            "reinforce_plus_plus gamma=0.9",
            partial(
                ours.compute_advantages,
                "reinforce_plus_plus",
                token_level_rewards=dense,
                response_mask=mask,
                gamma=0.9,
                lam=1.0,
                norm_adv_by_std_in_grpo=True,
            ),
            partial(ca.compute_reinforce_plus_plus_outcome_advantage, dense, mask, config=algo(gamma=0.9)),
        ),
        (
            "reinforce_plus_plus (masked span, padding rewards)",
            partial(
                ours.compute_advantages,
                "reinforce_plus_plus",
                token_level_rewards=noisy,
                response_mask=holes,
                gamma=0.9,
                lam=1.0,
                norm_adv_by_std_in_grpo=True,
            ),
            partial(ca.compute_reinforce_plus_plus_outcome_advantage, noisy, holes, config=algo(gamma=0.9)),
        ),
    ]
    for sname, scores in (("binary", binary), ("continuous", continuous)):
        rewards = outcome(scores)
        group = {"token_level_rewards": rewards, "response_mask": mask, "index": index, "gamma": 1.0, "lam": 1.0}
        for norm in (True, False):
            cases.append(
                (
                    f"grpo norm={norm} {sname}",
                    partial(ours.compute_advantages, "grpo", norm_adv_by_std_in_grpo=norm, **group),
                    partial(ca.compute_grpo_outcome_advantage, rewards, mask, index, 1e-6, norm),
                )
            )
            cases.append(
                (
                    f"grpo_passk norm={norm} {sname}",
                    partial(ours.compute_advantages, "grpo_passk", norm_adv_by_std_in_grpo=norm, **group),
                    # verl reads the flag from its config, not from its keyword argument
                    partial(
                        ca.compute_grpo_passk_outcome_advantage, rewards, mask, index, 1e-6, config=algo(norm=norm)
                    ),
                )
            )
        for name, fn in (
            ("opo", ca.compute_opo_outcome_advantage),
            ("reinforce_plus_plus_baseline", ca.compute_reinforce_plus_plus_baseline_outcome_advantage),
            ("rloo", ca.compute_rloo_outcome_advantage),
            ("rloo_vectorized", ca.compute_rloo_vectorized_outcome_advantage),
        ):
            cases.append(
                (
                    f"{name} {sname}",
                    partial(ours.compute_advantages, name, norm_adv_by_std_in_grpo=True, **group),
                    partial(fn, rewards, mask, index, config=algo()),
                )
            )
    shared = {name for name in ours.ADV_ESTIMATORS if name in set(ca.ADV_ESTIMATOR_REGISTRY)}
    print(f"# advantage estimators shared with verl: {', '.join(sorted(shared))}")

    def compare(label: str, mine: Thunk, theirs: Thunk) -> None:
        m, v = mine(), theirs()
        rep.close(f"{label} advantages", m[0], v[0])
        rep.close(f"{label} returns", m[1], v[1])

    for label, mine, theirs in cases:
        rep.run(label, compare, label, mine, theirs)


def check_kl(rep: Report, verl: Any, x: dict[str, Any]) -> None:
    ref = x["old"] + 0.5 * torch.randn(B, T, generator=x["gen"])
    for kind in sorted(ours.KL_KINDS):

        def _case(kind: str = kind) -> None:
            a = x["log_prob"].clone().requires_grad_(True)
            b = x["log_prob"].clone().requires_grad_(True)
            mine = ours.kl_penalty(a, ref, kind)
            theirs = verl.core_algos.kl_penalty(b, ref, kind)
            rep.close(f"kl_penalty {kind} value", mine, theirs)
            (mine * x["mask"]).sum().backward()
            (theirs * x["mask"]).sum().backward()
            rep.close(f"kl_penalty {kind} gradient", a.grad, b.grad)

        rep.run(f"kl_penalty {kind}", _case)


_IS_METRICS = (
    "rollout_is_mean",
    "rollout_is_max",
    "rollout_is_min",
    "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low",
    "rollout_is_eff_sample_size",
    "rollout_is_oob_ratio",
    "rollout_is_batch_norm_factor",
)


def check_rollout_is(rep: Report, verl: Any, x: dict[str, Any]) -> None:
    mask = x["mask"]
    log_ratio = x["old"] - x["rollout"]
    for level, thresholds in (("token", (2.0, "1.5", "0.5_2.0")), ("sequence", (5.0, "0.2_5.0"))):
        for threshold in thresholds:
            for normalize in (False, True):
                label = f"rollout_is_weights level={level} threshold={threshold!r} batch_normalize={normalize}"

                def _case(
                    level: str = level, threshold: Any = threshold, normalize: bool = normalize, label: str = label
                ) -> None:
                    mine, m_metrics = ours.rollout_is_weights(
                        x["old"],
                        x["rollout"],
                        mask,
                        level=level,
                        upper=parse_is_threshold(threshold)[0],
                        lower=parse_is_threshold(threshold)[1],
                        batch_normalize=normalize,
                    )
                    theirs, v_metrics = verl.rc.compute_rollout_correction_weights(
                        log_ratio, mask, level, threshold, normalize
                    )
                    rep.close(f"{label} weights", mine, theirs)
                    for key in _IS_METRICS:
                        if key in m_metrics or key in v_metrics:
                            if key not in m_metrics or key not in v_metrics:
                                rep._line(f"{label} {key}", False, "metric missing on one side")
                                continue
                            rep.close(f"{label} {key}", m_metrics[key], v_metrics[key])

                rep.run(label, _case)


_RS_CASES: tuple[tuple[str, Any], ...] = (
    ("token_k1", "0.7_1.3"),
    ("token_k1", 1.5),
    ("token_k2", 0.05),
    ("token_k3", 0.05),
    ("seq_sum_k1", "0.4_2.0"),
    ("seq_sum_k2", 0.5),
    ("seq_sum_k3", 0.5),
    ("seq_mean_k1", "0.9_1.2"),
    ("seq_mean_k2", 0.05),
    ("seq_mean_k3", 0.05),
    ("seq_max_k2", 0.2),
    ("seq_max_k3", 0.2),
    ("token_k1,seq_mean_k3,seq_max_k2", "0.6_1.4,0.05,0.3"),
    ("seq_sum_k2,seq_max_k3", 0.4),
)


def check_rejection(rep: Report, verl: Any, x: dict[str, Any]) -> None:
    mask = x["mask"]
    log_ratio = x["old"] - x["rollout"]
    for options, thresholds in _RS_CASES:
        label = f"rejection_mask {options} thresholds={thresholds!r}"

        def _case(options: str = options, thresholds: Any = thresholds, label: str = label) -> None:
            mine, m_metrics = ours.rejection_mask(
                x["old"], x["rollout"], mask, bounds=parse_rs_spec(options, thresholds)
            )
            theirs, v_metrics = verl.rc.compute_rollout_rejection_mask(log_ratio, mask, options, thresholds)
            rep.exact(f"{label} mask", mine, theirs)
            kept = float((mine * mask).sum() / mask.sum())
            for key in sorted(m_metrics):
                rep.close(f"{label} {key} (kept {kept:.2f})", m_metrics[key], v_metrics[key])

        rep.run(label, _case)


def _load_verl() -> Any:
    import verl
    import verl.trainer.ppo.core_algos as core_algos
    import verl.trainer.ppo.rollout_corr_helper as rc
    from verl.trainer.config import AlgoConfig, RolloutCorrectionConfig
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return types.SimpleNamespace(
        version=verl.__version__,
        core_algos=core_algos,
        rc=rc,
        agg_loss=core_algos.agg_loss,
        ActorConfig=ActorConfig,
        PolicyLossConfig=PolicyLossConfig,
        AlgoConfig=AlgoConfig,
        RolloutCorrectionConfig=RolloutCorrectionConfig,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-ray-stub", action="store_true", help="require a real ray installation")
    args = parser.parse_args(argv)
    if not args.no_ray_stub:
        _install_ray_stub()
    try:
        verl = _load_verl()
    except ImportError as exc:
        print(f"verl is not importable ({exc}); nothing was compared")
        return 2
    if verl.version != "0.9.1":
        print(f"warning: verl {verl.version} found; this script was written against verl 0.9.1")
    print(f"# async_rl vs verl {verl.version}, torch {torch.__version__}, float32, B={B} T={T}, seed {args.seed}")
    torch.manual_seed(args.seed)
    x = _inputs(args.seed)
    rep = Report()
    for check in (
        check_agg_loss,
        check_policy_losses,
        check_reinforce,
        check_advantages,
        check_kl,
        check_rollout_is,
        check_rejection,
    ):
        check(rep, verl, x)
    failed = [name for name, ok in rep.results if not ok]
    print(f"SUMMARY: {len(rep.results) - len(failed)} PASS, {len(failed)} FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
