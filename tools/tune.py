"""Throughput tuner: profile a config on the real pieces, simulate deployments, recommend one per GPU count.

    python tools/tune.py --config configs/demo_grpo.yaml [--gpus 8 16 64 256] [--out outputs/tune] [key=value ...]
    python tools/tune.py --profile outputs/tune/profile.json --gpus 8 64     # reuse a saved profile
    python tools/tune.py --profile outputs/tune/profile.json --validate     # real runs here vs the simulator

On a machine shared with other jobs, serialize it: ``flock /tmp/async_rl_cpu.lock python tools/tune.py ...``.

Profiling (a few minutes on CPU for the demo's tiny model, much longer for a real one) measures vLLM generation
tokens/s at several concurrency levels, the learner step at 1 and 2 ranks, the weight-update time at two model sizes
and the actor/learner slow-down when sharing cores (generation keeps running until the learner has timed two steps
beside it, however long a step takes), prints the probes' progress, and saves ``profile.json``. A probe that cannot
measure stops the tuner with a message naming it and what to change (``--probe-timeout``, ``--contend-slowdown``).

It also times three learner settings, and on CPU the actor's rollout dtype, both ways on this host and recommends
each, with the measured times, as ``set key=value (measured X s vs Y s per learner step: ...)`` (``per step's
generation`` for ``actor_rollout_ref.rollout.dtype``, bfloat16 vs float32) on the console and in
``recommendations.md``:
``actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype`` (fp32 vs bf16: bf16 is slower on AVX2-only CPUs
and on an Intel Xeon without AMX, faster with AMX and on AMD's avx512_bf16),
``actor_rollout_ref.model.use_shared_prompt`` (each group's prompt computed once, or per sequence) and
``trainer.n_gpus_per_node`` (the learner as 2 ranks x 1 thread or 1 rank x all cores, each timed beside vLLM
generation as a run here shares its cores with the actor). The config's own value
is kept unless the other was more than 5% faster (``async_rl.tuning.settings.SWITCH_MARGIN``).

The simulator (``async_rl.tuning.simulator``) then searches, for every GPU count, the actor:learner split, rollout
concurrency, train_batch_size and max_staleness; the scaling assumptions from this machine to the target are printed
and can be changed (``--gen-scale``, ``--learner-scale``, ``--efficiency``, ``--sync-log-factor``, ``--model-bytes``,
``--learner-fixed-s``). Output: ``recommendations.md``, ``recommendations.csv`` (best per GPU count),
``candidates.csv`` (everything simulated) and ``throughput.png`` in ``--out``. ``--validate`` first runs the profiled
config at K=0 (in-job calibration of the learner step, broadcast and per-step overhead), then the real job for three
other configurations through ``launchers/local.py``, and prints and writes (``validation.md``) the simulator's
prediction error on each.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.tuning.probes import ProbeError  # noqa: E402
from async_rl.tuning.profile import MeasureOptions, Profile, measure  # noqa: E402
from async_rl.tuning.recommend import Assumptions, recommend  # noqa: E402
from async_rl.tuning.report import markdown_table, plot, write_csv  # noqa: E402
from async_rl.tuning.settings import settings_lines  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append", default=[], help="config file(s) to profile")
    p.add_argument("--profile", default=None, help="a saved profile.json: skip profiling")
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 16, 64, 256], help="GPU counts to plan for")
    p.add_argument("--out", default="outputs/tune", help="output directory")
    p.add_argument("--validate", action="store_true", help="also run real jobs here and print the prediction error")
    p.add_argument("--validate-steps", type=int, default=30)
    p.add_argument("--validate-reuse", action="store_true", help="re-read finished validation runs, do not rerun")
    p.add_argument("--reuse-probes", action="store_true", help="keep probe results already under <out>/probes")
    # probe options: None keeps MeasureOptions' own value
    p.add_argument(
        "--gen-seconds",
        type=float,
        default=None,
        help=f"seconds per generation concurrency level [{MeasureOptions.gen_seconds:g}]",
    )
    p.add_argument(
        "--probe-timeout",
        type=float,
        default=None,
        help=f"wall-clock cap per probe run, seconds [{MeasureOptions.timeout_s:g}]",
    )
    p.add_argument(
        "--contend-slowdown",
        type=float,
        default=None,
        help="how many times its step alone the learner may take per step beside generation before that probe gives"
        f" up [{MeasureOptions.contend_slowdown:g}]",
    )
    p.add_argument("--gen-scale", type=float, default=1.0, help="target GPU actor tokens/s / measured actor's")
    p.add_argument("--learner-scale", type=float, default=1.0, help="target learner rank tokens/s / measured rank's")
    p.add_argument("--efficiency", type=float, default=0.9, help="learner scaling efficiency per doubling of ranks")
    p.add_argument("--sync-log-factor", type=float, default=0.1, help="broadcast time growth per doubling of actors")
    p.add_argument("--model-bytes", type=int, default=None, help="weights to broadcast (default: the profiled model)")
    p.add_argument(
        "--learner-fixed-s", type=float, default=None, help="learner fixed cost per step (default: measured)"
    )
    p.add_argument("--steps", type=int, default=24, help="simulated learner steps per candidate")
    p.add_argument("overrides", nargs="*", metavar="dotted.key=value", help="config overrides (when profiling)")
    args = p.parse_intermixed_args(argv)
    if not args.profile and not args.config:
        p.error("give --config to profile, or --profile FILE to reuse a profile")
    if any(g < 2 for g in args.gpus):
        p.error(f"--gpus must all be >= 2, got {args.gpus}")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="tune: %(message)s")
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.profile:
        profile = Profile.load(args.profile)
    else:
        given = {"gen_seconds": args.gen_seconds, "timeout_s": args.probe_timeout}
        given["contend_slowdown"] = args.contend_slowdown
        opts = MeasureOptions(reuse=args.reuse_probes, **{k: v for k, v in given.items() if v is not None})
        try:
            profile = measure(args.config, args.overrides, out / "probes", opts)
        except ProbeError as err:
            print(f"tune: profiling stopped: {err}", file=sys.stderr)
            return 1
        profile.save(out / "profile.json")
        print(f"profile saved to {out / 'profile.json'}")
    print(describe_profile(profile))
    settings = settings_lines(profile)
    print("\nsettings for the profiled host (each timed both ways here):")
    for line in settings:
        print(f"  {line}")
    assumptions = Assumptions(
        gen_scale=args.gen_scale,
        learner_scale=args.learner_scale,
        efficiency_per_doubling=args.efficiency,
        sync_log_factor=args.sync_log_factor,
        model_bytes=args.model_bytes,
        learner_fixed_s=args.learner_fixed_s,
    )
    print("\nscaling assumptions (the profile is from this machine, not the target):")
    for line in assumptions.lines(profile):
        print(f"  - {line}")
    best, everything = [], []
    for gpus in args.gpus:
        chosen, tried = recommend(profile, gpus, assumptions, steps=args.steps)
        best.append(chosen)
        everything += tried
        c, r = chosen.candidate, chosen.result
        print(
            f"{gpus} GPUs: {c.learner_gpus} learner + {c.actors} actor GPUs, concurrency {c.concurrency}, "
            f"batch {c.batch}, K={c.max_staleness}: {r.trained_tokens_per_s:.0f} tokens/s, "
            f"{r.steps_per_s:.3f} steps/s, bottleneck {chosen.bottleneck}"
        )
    table = markdown_table(best)
    print("\n" + table)
    header = "\n".join(f"- {line}" for line in assumptions.lines(profile))
    measured = "\n".join(f"- {line}" for line in settings)
    (out / "recommendations.md").write_text(
        f"# Recommendations\n\nSettings for the profiled host ({profile.device}, {profile.cores} cores), each"
        f" timed both ways there:\n{measured}\n\nDeployments. Assumptions:\n{header}\n\n{table}\n"
    )
    write_csv(best, out / "recommendations.csv")
    write_csv(everything, out / "candidates.csv")
    plot(best, out / "throughput.png")
    print(f"\nwrote {out / 'recommendations.md'}, recommendations.csv, candidates.csv, throughput.png")
    if args.validate:
        from async_rl.tuning.validate import calibrate, format_outcomes, validate

        if profile.calibration is None or not args.validate_reuse:
            profile = calibrate(profile, out / "validate", rerun=not args.validate_reuse)
            profile.save(out / "profile.json")
        print(f"in-job calibration (K=0 run of the profiled config): {profile.calibration}")
        outcomes = validate(profile, out / "validate", steps=args.validate_steps, rerun=not args.validate_reuse)
        text = format_outcomes(outcomes)
        print("\nvalidation (real runs on this machine vs the simulator):\n" + text)
        (out / "validation.md").write_text("# Validation\n\n" + text + "\n")
    return 0


def describe_profile(p: Profile) -> str:
    gen = ", ".join(f"{x:.0f}:{y:.0f}" for x, y in zip(p.gen_sequences, p.gen_tokens_per_s, strict=True))
    lines = [
        f"profile of {' '.join(p.config)} {' '.join(p.overrides)} ({p.device}, {p.cores} cores)",
        f"  generation, sequences in flight:tokens/s  {gen}",
        f"  response length mean {sum(p.response_lengths) / len(p.response_lengths):.1f}, prompt {p.prompt_len:.1f}",
    ]
    for ws in p.world_sizes():
        m = p.learner_model(ws)
        lines.append(f"  learner world {ws}: {m.fixed_s:.3f} s + tokens / {m.tokens_per_s:.0f} per s")
    lines.append(f"  weight update of {p.model_bytes / (1 << 20):.2f} MiB: {p.sync_s():.3f} s")
    if p.shared is not None:
        lines.append(
            f"  sharing cores: generation x{p.shared.generation_factor:.2f} while training, "
            f"training x{p.shared.train_factor:.2f} while generating"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
