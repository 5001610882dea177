"""Search deployments with the simulator: actor:learner GPU split, rollout concurrency, batch size and staleness.

A profile is measured on this machine (CPU), so predictions for 8 to 256 GPUs rest on explicit assumptions
(:class:`Assumptions`, printed with every table): one actor per GPU generating at the measured per-actor curve times
``gen_scale``; learner tokens/s at the largest measured world size times ``learner_scale``, scaled to ``W`` ranks
with ``efficiency_per_doubling`` lost per doubling; one weight broadcast costing the measured update time of the
model's bytes, growing by ``sync_log_factor`` per doubling of receivers (a tree/ring broadcast, not per-actor
copies). Nothing here is measured at those sizes; change the assumptions on the command line to match the target.

The search per GPU count: first every learner size (powers of two below the GPU count) at the profile's own
concurrency, batch and K; then a grid of concurrency x batch x K around the two best splits. The best deployment
maximises trained tokens/s; among those within ``tie_tolerance`` of it, the smallest K (least off-policy) wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from async_rl.tuning.profile import Profile
from async_rl.tuning.simulator import LearnerModel, SimConfig, SimResult, simulate


@dataclass(frozen=True)
class Assumptions:
    """How rates measured here scale to the target deployment (see the module docstring)."""

    gen_scale: float = 1.0  # one target GPU's actor tokens/s / one actor's tokens/s measured here
    learner_scale: float = 1.0  # one target learner rank's tokens/s / one rank's measured here
    efficiency_per_doubling: float = 0.9  # learner tokens/s keeps this fraction of ideal per doubling of ranks
    sync_log_factor: float = 0.1  # broadcast time grows by this fraction per doubling of receiving actors
    model_bytes: int | None = None  # None: the profiled model's bytes
    learner_fixed_s: float | None = None  # per-step fixed learner cost; None: as measured at the largest world size

    def lines(self, profile: Profile) -> list[str]:
        base = max(profile.world_sizes())
        measured = _measured_efficiency(profile)
        eff = "n/a" if measured is None else f"{measured:.2f}"
        nbytes = self.model_bytes if self.model_bytes is not None else profile.model_bytes
        m = profile.learner_model(base)
        fixed = m.fixed_s if self.learner_fixed_s is None else self.learner_fixed_s
        return [
            f"one actor per GPU at {self.gen_scale:g} x the measured per-actor curve "
            f"(peak {max(profile.gen_tokens_per_s):.0f} tokens/s here at {max(profile.gen_sequences):.0f} sequences)",
            f"learner: {self.learner_scale:g} x the rate measured at {base} rank(s), then "
            f"{self.efficiency_per_doubling:g} efficiency per doubling of ranks (measured here, 1 -> 2 ranks on "
            f"{profile.cores} shared cores, at the profiled batch: {eff})",
            f"learner fixed cost per step {fixed:.3f} s at every world size (measured at {base} rank(s): "
            f"{m.fixed_s:.3f} s; it does not shrink with more ranks, so it caps steps/s)",
            f"weight broadcast: {nbytes / (1 << 20):.1f} MiB, measured update time "
            f"{profile.sync_s(nbytes):.3f} s, +{self.sync_log_factor:g} per doubling of actors",
            "actors and learner on separate GPUs (no shared-compute slow-down); tensor parallel size 1",
        ]


def _measured_efficiency(profile: Profile) -> float | None:
    """Per-doubling scaling efficiency of the learner's step time at the profiled batch, smallest to largest size."""
    sizes = profile.world_sizes()
    if len(sizes) < 2:
        return None
    lo, hi = sizes[0], sizes[-1]
    tokens = profile.groups_per_step * profile.group_size * (profile.prompt_len + _mean(profile.response_lengths))
    speedup = profile.learner_model(lo).step_s(tokens) / profile.learner_model(hi).step_s(tokens)
    return float((speedup / (hi / lo)) ** (1 / math.log2(hi / lo)))


def _mean(values: tuple[int, ...]) -> float:
    return sum(values) / len(values)


def learner_at(profile: Profile, world_size: int, a: Assumptions) -> LearnerModel:
    """The learner model at ``world_size`` ranks under the assumptions (measured directly when profiled)."""
    base = max(profile.world_sizes())
    m = profile.learner_model(base)
    if world_size in profile.world_sizes() and a.learner_scale == 1.0 and a.learner_fixed_s is None:
        return profile.learner_model(world_size)
    ratio = world_size / base
    speedup = ratio * a.efficiency_per_doubling ** math.log2(ratio) if ratio > 0 else 1.0
    fixed = m.fixed_s if a.learner_fixed_s is None else a.learner_fixed_s
    return LearnerModel(fixed_s=fixed, tokens_per_s=m.tokens_per_s * a.learner_scale * speedup)


def sync_at(profile: Profile, actors: int, a: Assumptions) -> float:
    return profile.sync_s(a.model_bytes) * (1.0 + a.sync_log_factor * math.log2(max(actors, 1)))


@dataclass(frozen=True)
class Candidate:
    gpus: int
    learner_gpus: int
    actors: int
    concurrency: int  # max_concurrent_groups per actor
    batch: int  # train_batch_size (prompt groups per step)
    max_staleness: int


@dataclass(frozen=True)
class Recommendation:
    candidate: Candidate
    result: SimResult
    bottleneck: str
    tokens_per_step: float

    def row(self) -> dict[str, str | int | float]:
        c, r = self.candidate, self.result
        return {
            "gpus": c.gpus,
            "learner_gpus": c.learner_gpus,
            "actor_gpus": c.actors,
            "rollout_concurrency": c.concurrency,
            "train_batch_size": c.batch,
            "max_staleness": c.max_staleness,
            "steps_per_s": round(r.steps_per_s, 4),
            "trained_tokens_per_s": round(r.trained_tokens_per_s, 1),
            "learner_idle": round(r.learner_idle_fraction, 3),
            "learner_sync": round(r.learner_sync_fraction, 3),
            "actor_idle": round(r.actor_idle_fraction, 3),
            "mean_staleness": round(r.mean_staleness, 2),
            "drop_rate": round(r.drop_rate, 3),
            "bottleneck": self.bottleneck,
        }


def bottleneck(r: SimResult) -> str:
    """Name what limits throughput, from where the time goes."""
    if r.learner_sync_fraction > 0.3:
        return "weight sync"
    if r.learner_idle_fraction > 0.15 and r.actor_idle_fraction < 0.15:
        return "generation"
    if r.learner_idle_fraction <= 0.15 and r.actor_idle_fraction > 0.15:
        return "learner"
    if r.learner_idle_fraction > 0.15 and r.actor_idle_fraction > 0.15:
        return "staleness bound"  # both wait: admission holds actors back while the learner starves
    return "balanced"


def sim_config(profile: Profile, c: Candidate, a: Assumptions, *, steps: int, seed: int) -> SimConfig:
    return SimConfig(
        workload=profile.workload(),
        actor_curve=profile.curve().scaled(a.gen_scale),
        learner=learner_at(profile, c.learner_gpus, a),
        num_actors=c.actors,
        max_concurrent_groups=c.concurrency,
        groups_per_step=c.batch,
        max_staleness=c.max_staleness,
        sync_s=sync_at(profile, c.actors, a),
        sync_every=profile.sync_every,
        steps=steps,
        warmup_steps=max(2, steps // 5),
        seed=seed,
    )


def evaluate(profile: Profile, c: Candidate, a: Assumptions, steps: int = 24) -> Recommendation:
    result = simulate(sim_config(profile, c, a, steps=steps, seed=0))
    per_step = result.trained_tokens_per_s / result.steps_per_s if result.steps_per_s > 0 else 0.0
    return Recommendation(c, result, bottleneck(result), per_step)


def _learner_sizes(gpus: int) -> list[int]:
    sizes, w = [], 1
    while w < gpus:
        sizes.append(w)
        w *= 2
    return sizes


def recommend(
    profile: Profile,
    gpus: int,
    a: Assumptions,
    *,
    staleness: tuple[int, ...] = (0, 1, 2, 4),
    batch_factors: tuple[int, ...] = (1, 2, 4, 8),
    concurrency_factors: tuple[float, ...] = (0.5, 1.0, 2.0),
    steps: int = 24,
    tie_tolerance: float = 0.02,
) -> tuple[Recommendation, list[Recommendation]]:
    """The best deployment on ``gpus`` GPUs and every candidate evaluated (see the module docstring)."""
    if gpus < 2:
        raise ValueError(f"a deployment needs >= 2 GPUs (one learner, one actor), got {gpus}")
    c0, b0, k0 = profile.max_concurrent_groups, profile.groups_per_step, profile.max_staleness
    tried: dict[Candidate, Recommendation] = {}

    def run(c: Candidate) -> Recommendation:
        if c not in tried:
            tried[c] = evaluate(profile, c, a, steps)
        return tried[c]

    splits = [run(Candidate(gpus, w, gpus - w, c0, b0, k0)) for w in _learner_sizes(gpus)]
    splits.sort(key=lambda r: -r.result.trained_tokens_per_s)
    for best in splits[:2]:
        w = best.candidate.learner_gpus
        for cf in concurrency_factors:
            for bf in batch_factors:
                for k in staleness:
                    run(Candidate(gpus, w, gpus - w, max(1, round(c0 * cf)), b0 * bf, k))
    everything = list(tried.values())
    top = max(r.result.trained_tokens_per_s for r in everything)
    near = [r for r in everything if r.result.trained_tokens_per_s >= (1 - tie_tolerance) * top]
    chosen = min(near, key=lambda r: (r.candidate.max_staleness, -r.result.trained_tokens_per_s))
    return chosen, sorted(everything, key=lambda r: -r.result.trained_tokens_per_s)
