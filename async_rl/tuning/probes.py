"""Measurement probes on the real pieces, each run as its own process by :mod:`async_rl.tuning.profile`.

    python -m async_rl.tuning.probes generation --params '{"config": [...], "overrides": [...], ...}' --out g.json
    torchrun --standalone --nproc_per_node 2 -m async_rl.tuning.probes learner --params '{...}' --out l.json

* ``generation``: the actor's :class:`GenerationEngine` (vLLM, the config's engine settings and sampling) keeps
  ``c`` prompt groups in flight for a few seconds at each concurrency level (closed loop, real prompts from the
  config's data) and reports generated tokens/s and the response lengths it saw;
* ``learner``: every torchrun rank builds the config's :class:`Learner` and times ``share_batch`` + ``train_batch``
  on synthetic groups shaped like the workload (real prompt lengths, measured response lengths) at one or more
  batch sizes; rank 0 reports the median step time per size. With ``trials`` it then times, on the smallest batch,
  a second learner that differs in one setting (:data:`KNOBS`: compute precision, shared-prompt layout), in rounds
  that alternate which of the two goes first;
* ``rollout_dtype``: the actor's precision trial: two engines, at the config's ``rollout.dtype`` as it resolves here
  and at the other of bfloat16 / float32, take turns generating in rounds (CPU only: on a GPU bf16 is the rule, and
  two engines would not share one GPU's memory); reported like a learner setting trial, as the seconds one step's
  tokens take at each round's rate.

Paired (the generation probe and the first learner probe started together), they meet at marker files: both up ->
generation alone -> learner alone -> both at once. The last level keeps generation running until the learner has
timed :data:`CONTENDED_STEPS` steps beside it, however long a step takes, up to a cap sized from the learner's own
step time measured alone. A probe that cannot measure raises :class:`ProbeError`, whose message names the probe and
what to change; progress lines start with :data:`PROGRESS` (the tuner relays them to its console).

A separate process per probe keeps vLLM's helper processes and the process group out of the tuner itself.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLEAR_RATIO = 2.0
"""A setting trial stops after a round once every step of one side took at least this many times every step of the
other's (bf16 emulated on an AVX2 CPU is about 14x slower: further rounds would only cost minutes)."""
CONTENDED_STEPS = 2
"""Learner steps the contended level must time beside generation (a step still running when generation stops is not
counted), for the generation/learner slow-down the simulator uses."""
LAYOUT_CONTENDED_STEPS = 1
"""... and for the ranks x threads trial only (the other world size's probe): one step beside generation decides it,
since a layout whose threads fight the actor's for the cores is many times slower there, not a few percent."""
PROGRESS = "probe| "
"""Prefix of a probe's progress lines (relayed to the tuner's console)."""
PROBE_FAILED = "probe failed: "
"""Prefix of the line a probe prints before it exits on a :class:`ProbeError`."""


class ProbeError(RuntimeError):
    """A probe could not measure what it is for; the message names the probe and what to change."""


def median_step(times: list[float], probe: str, fix: str, *, least: int = 1) -> float:
    """The median of the step times ``probe`` recorded; :class:`ProbeError` naming ``probe`` and ``fix`` (what to
    change) when it recorded fewer than ``least``."""
    if len(times) < least:
        raise ProbeError(f"{probe}: {len(times)} step(s) recorded, {least} needed; {fix}")
    return statistics.median(times)


@dataclass(frozen=True)
class Knob:
    """A learner setting the probe can time both ways: a dotted config key with two values, and how to read the
    value a built learner actually runs with (``auto`` resolved, a layout fallen back)."""

    key: str
    values: tuple[str, str]
    ran_with: Callable[[Any], str]

    def other(self, value: str) -> str:
        return self.values[1 - self.values.index(value)]


def _precision(learner: Any) -> str:
    import torch

    return "bf16" if learner.compute_dtype == torch.bfloat16 else "fp32"


def _shared_prompt(learner: Any) -> str:
    return "true" if learner.layout == "shared" else "false"


KNOBS = {
    k.key: k
    for k in (
        Knob("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype", ("fp32", "bf16"), _precision),
        Knob("actor_rollout_ref.model.use_shared_prompt", ("true", "false"), _shared_prompt),
    )
}
"""The settings trials time (by config key)."""


def _progress(text: str) -> None:
    print(PROGRESS + text, flush=True)


def clear_winner(a: list[float], b: list[float], ratio: float = CLEAR_RATIO) -> bool:
    """Whether the step times ``a`` and ``b`` (seconds) already decide a trial: every one of one side is at least
    ``ratio`` times every one of the other's."""
    return bool(a and b) and (min(a) >= ratio * max(b) or min(b) >= ratio * max(a))


def _signal(params: dict[str, Any], name: str, text: str = "") -> None:
    """Leave a marker file holding ``text`` for the other probe (the probes meet at markers so measurements never
    overlap); written aside and renamed, so a marker that exists is complete."""
    path = Path(params["marks"]) / name
    path.with_suffix(".tmp").write_text(text)
    path.with_suffix(".tmp").replace(path)


def _seen(params: dict[str, Any], name: str) -> bool:
    return (Path(params["marks"]) / name).exists()


def _await(params: dict[str, Any], name: str) -> None:
    """Wait for marker ``name`` at most the probes' ``timeout_s`` (the tuner stops both probes then anyway)."""
    timeout_s = float(params["timeout_s"])
    deadline = time.monotonic() + timeout_s
    while not _seen(params, name):
        if time.monotonic() > deadline:
            raise ProbeError(f"probe marker {name!r} did not appear within {timeout_s:.0f} s; raise --probe-timeout")
        time.sleep(0.05)


def _config(params: dict[str, Any], *extra: str) -> Any:
    from async_rl.config import load_config

    return load_config(list(params["config"]), [*params.get("overrides", []), *extra])


def _model_and_records(cfg: Any, workdir: Path) -> tuple[str, list[Any]]:
    from transformers import AutoTokenizer

    from async_rl.runtime import resources

    workdir.mkdir(parents=True, exist_ok=True)
    model_path = resources.resolve_model_path(cfg.actor_rollout_ref.model.path, workdir)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return model_path, resources.prompt_records(cfg, tokenizer)


# ---------------------------------------------------------------------------------------------------------------------
# Generation


def prompt_cycle(records: list[Any]) -> Callable[[], list[int]]:
    """The records' prompt token ids in turn, round and round (the probes' closed loop of real prompts)."""
    cursor = 0

    def next_prompt() -> list[int]:
        nonlocal cursor
        cursor += 1
        return [int(t) for t in records[cursor % len(records)].token_ids]

    return next_prompt


async def keep_in_flight(
    engine: Any,
    sampling: Any,
    next_prompt: Callable[[], list[int]],
    groups: int,
    seconds: float,
    past: Callable[[float], bool] = lambda elapsed: True,
) -> tuple[float, list[int]]:
    """Keep ``groups`` prompt groups in flight on ``engine`` for ``seconds``, and after that until ``past(elapsed)``
    says stop; returns the generated tokens/s and every completion's length. :class:`ProbeError` when no token came."""
    start = time.perf_counter()
    lengths: list[int] = []

    def going() -> bool:
        elapsed = time.perf_counter() - start
        return elapsed < seconds or not past(elapsed)

    async def worker() -> None:
        while going():
            for c in await engine.generate(next_prompt(), sampling):
                lengths.append(len(c.token_ids))

    await asyncio.gather(*[worker() for _ in range(groups)])
    elapsed = time.perf_counter() - start
    if not sum(lengths):
        raise ProbeError(
            f"generation probe: no token generated in {elapsed:.1f} s at {groups} groups in flight; check"
            " data.max_response_length and the rollout's sampling settings"
        )
    return sum(lengths) / elapsed, lengths


async def _generation(params: dict[str, Any]) -> dict[str, Any]:
    from async_rl.runtime.actor_main import build_engine
    from async_rl.transport.protocol import GroupSampling

    cfg = _config(params)
    model_path, records = _model_and_records(cfg, Path(params["workdir"]))
    sampling = GroupSampling.from_config(cfg, seed=None)
    engine = build_engine(cfg, model_path)
    await engine.start()
    paired = bool(params.get("contend_groups"))
    if paired:  # wait until the learner probe has started up too: its start-up must not overlap a measurement
        _signal(params, "gen_up")
        _await(params, "learner_up")
    next_prompt = prompt_cycle(records)

    async def run_level(
        groups: int, seconds: float, until: str | None = None, cap_s: float = 0.0
    ) -> tuple[float, list[int]]:
        """Keep ``groups`` in flight for ``seconds``, and past that until marker ``until`` appears (at most ``cap_s``
        in all): a real model's learner step can outlast the planned seconds. Returns tokens/s and the lengths."""

        def past(elapsed: float) -> bool:
            return until is None or _seen(params, until) or elapsed >= cap_s

        return await keep_in_flight(engine, sampling, next_prompt, groups, seconds, past)

    try:
        await run_level(max(params["levels"]), 2.0)  # warm-up: first-request compilation, allocator growth
        levels, rates, all_lengths = [], [], []
        for groups in params["levels"]:
            rate, lengths = await run_level(groups, float(params["seconds"]))
            levels.append(groups * sampling.n)
            rates.append(rate)
            all_lengths.extend(lengths)
            _progress(f"generation: {groups} groups x {sampling.n} in flight: {rates[-1]:.0f} tokens/s")
        contended = None
        if paired:
            _signal(params, "gen_alone_done")
            _await(params, "learner_alone_done")
            alone_s = float((Path(params["marks"]) / "learner_alone_done").read_text())
            seconds = float(params["contend_seconds"])
            # the learner's step in flight when generation starts, then the steps it must time, each allowed
            # contend_slowdown x its time alone
            steps = int(params.get("contend_steps", CONTENDED_STEPS))
            cap_s = seconds + float(params["contend_slowdown"]) * (steps + 1) * alone_s
            await asyncio.sleep(1.0)  # let the learner's first contended step start
            _progress(
                f"generation beside the learner: until it has timed {steps} step(s) (a step alone took"
                f" {alone_s:.2f} s; at most {cap_s:.0f} s)"
            )
            _signal(params, "gen_started")
            t0 = time.perf_counter()
            contended, _ = await run_level(
                int(params["contend_groups"]), seconds, until="learner_contended_enough", cap_s=cap_s
            )
            _signal(params, "gen_done")
            took = time.perf_counter() - t0
            _progress(f"generation while the learner trains: {contended:.0f} tokens/s over {took:.1f} s")
    finally:
        await engine.shutdown()
    prompt_lens = [len(rec.token_ids) for rec in records[:2000]]
    return {
        "sequences_in_flight": levels,
        "tokens_per_s": rates,
        "response_lengths": all_lengths[:4096],
        "prompt_len_mean": statistics.fmean(prompt_lens),
        "contended_tokens_per_s": contended,
    }


ROLLOUT_DTYPE_KEY = "actor_rollout_ref.rollout.dtype"
ROLLOUT_DTYPES = ("bfloat16", "float32")
"""The rollout dtypes the precision trial of the actor compares (``auto`` resolves to one of them)."""


async def _rollout_dtype(params: dict[str, Any]) -> dict[str, Any] | None:
    """The actor's precision trial: one vLLM engine at the config's ``rollout.dtype`` as it resolves here and one at
    the other of :data:`ROLLOUT_DTYPES`, timed in ``rounds`` that alternate which goes first, each keeping ``groups``
    groups in flight for ``seconds``. Reported like a learner setting trial, as the seconds to generate one step's
    tokens (``data.train_batch_size`` x ``rollout.n`` x the mean response length both saw) at each round's rate.
    None when the config's dtype is neither (float16: nothing to compare it with here)."""
    from async_rl.actor.engine import actor_device
    from async_rl.config.precision import rollout_precision
    from async_rl.runtime.actor_main import build_engine
    from async_rl.transport.protocol import GroupSampling

    cfg = _config(params)
    incumbent = rollout_precision(cfg.actor_rollout_ref.rollout.dtype, actor_device())[0]
    if incumbent not in ROLLOUT_DTYPES:
        return None
    other = ROLLOUT_DTYPES[1 - ROLLOUT_DTYPES.index(incumbent)]
    model_path, records = _model_and_records(cfg, Path(params["workdir"]))
    sampling = GroupSampling.from_config(cfg, seed=None)
    next_prompt = prompt_cycle(records)
    engines = {}
    try:
        for dtype in (incumbent, other):
            engines[dtype] = build_engine(_config(params, f"{ROLLOUT_DTYPE_KEY}={dtype}"), model_path)
            await engines[dtype].start()
        rates, lengths = await dtype_rounds(engines, sampling, next_prompt, params)
    finally:
        for engine in engines.values():
            await engine.shutdown()
    tokens = cfg.data.train_batch_size * sampling.n * statistics.fmean(lengths)
    return {
        "key": ROLLOUT_DTYPE_KEY,
        "values": [incumbent, other],
        "times_s": [[tokens / r for r in rates[incumbent]], [tokens / r for r in rates[other]]],
        "tokens": round(tokens),
        "generation": True,
    }


async def dtype_rounds(
    engines: dict[str, Any], sampling: Any, next_prompt: Callable[[], list[int]], params: dict[str, Any]
) -> tuple[dict[str, list[float]], list[int]]:
    """Each engine's generated tokens/s per round (``params``: ``rounds``, ``groups`` in flight, ``seconds``), after
    a warm-up on each; the engines take turns, the first of a round going last in the next. Returns the rates by
    engine key and every completion's length."""
    groups, seconds = int(params["groups"]), float(params["seconds"])
    order = list(engines)
    for key in order:  # warm-up: first-request work, allocator growth
        await keep_in_flight(engines[key], sampling, next_prompt, groups, 2.0)
    rates: dict[str, list[float]] = {key: [] for key in order}
    lengths: list[int] = []
    for r in range(int(params["rounds"])):
        for key in order if r % 2 == 0 else order[::-1]:
            rate, seen = await keep_in_flight(engines[key], sampling, next_prompt, groups, seconds)
            rates[key].append(rate)
            lengths.extend(seen)
            _progress(f"actor precision: round {r + 1}, rollout dtype {key}: {rate:.0f} tokens/s")
    return rates, lengths


# ---------------------------------------------------------------------------------------------------------------------
# Learner


def _synthetic_groups(
    records: list[Any], lengths: list[int], num: int, n: int, vocab: int, seed: int, *, teacher_scored: bool
) -> tuple[list[Any], dict[int, list[int]]]:
    """``num`` groups of ``n`` random completions and their prompts (drawn from ``records``) by prompt id; with
    ``teacher_scored`` each completion carries teacher log-probs, as a teacher engine's actor sends them."""
    from async_rl.learner.batching import local_group
    from async_rl.transport.protocol import make_completion

    rng = random.Random(seed)
    groups, prompts = [], {}
    for g in range(num):
        prompts[g] = [int(t) for t in records[rng.randrange(len(records))].token_ids]
        completions = []
        for _ in range(n):
            length = max(1, rng.choice(lengths))
            tokens = [rng.randrange(3, vocab) for _ in range(length)]
            teacher = [-1.5] * length if teacher_scored else None
            completions.append(
                make_completion(tokens, [-1.0] * length, version_min=0, reward=rng.random(), teacher_logprobs=teacher)
            )
        groups.append(local_group(g, completions))
    return groups, prompts


def _timed_step(ctx: Any, learner: Any, groups: list[Any], prompts: dict[int, list[int]]) -> float:
    """One step as a training run takes it (rank 0 collates, the ranks get the tensors, every rank trains); seconds."""
    from async_rl.learner.dist import share_batch

    t0 = time.perf_counter()
    rank0 = ctx.is_rank0
    batch, ids = share_batch(
        ctx, learner.collate(groups, prompts) if rank0 else None, [g.prompt_id for g in groups] if rank0 else None
    )
    learner.train_batch(batch, ids)
    return time.perf_counter() - t0


@dataclass(frozen=True)
class _Bench:
    """What every learner measurement of one probe shares: the process group, the model, the prompts, the vocabulary
    and the mini-batch count per step."""

    params: dict[str, Any]
    ctx: Any
    model_path: str
    records: list[Any]
    vocab: int
    minis_per_step: int

    def build(self, cfg: Any) -> Any:
        from async_rl.config.distillation import teacher_at
        from async_rl.config.resolve import learner_start
        from async_rl.learner.step import Learner

        # synthetic groups: pad id 0 (the probe's token ids are drawn from the vocabulary, never padded by a tokenizer)
        start = learner_start(cfg, pad_token_id=0, total_training_steps=None)
        # distillation with the teacher on the learner: the policy stands in for it (a teacher of its size)
        teacher = self.model_path if teacher_at(cfg.distillation, "learner") else None
        return Learner(cfg, start, self.ctx, self.model_path, teacher=teacher)

    def batch(self, cfg: Any, size: int) -> tuple[list[Any], dict[int, list[int]], int]:
        """``size`` synthetic groups (the same for the same size), their prompts and their tokens; sets ``cfg``'s
        mini-batch so a step has the config's number of optimizer steps (the learner reads that section per step)."""
        mini = size // self.minis_per_step if size % self.minis_per_step == 0 else size
        cfg.actor_rollout_ref.actor.ppo_mini_batch_size = mini
        from async_rl.config.distillation import teacher_at

        n = cfg.actor_rollout_ref.rollout.n
        groups, prompts = _synthetic_groups(
            self.records,
            self.params["response_lengths"],
            size,
            n,
            self.vocab,
            size,
            teacher_scored=teacher_at(cfg.distillation, "actor"),
        )
        tokens = sum(len(prompts[g.prompt_id]) + c.token_ids.length for g in groups for c in g.completions)
        return groups, prompts, tokens

    def say(self, text: str) -> None:
        if self.ctx.is_rank0:
            _progress(text)


def _trial(bench: _Bench, knob: Knob, base_cfg: Any, learner: Any, size: int) -> dict[str, Any] | None:
    """Time ``learner`` (the config's) against a second learner with ``knob`` at its other value on the same
    ``size`` groups, ``trial_rounds`` rounds alternating which goes first, after one warm-up step of the second."""
    rounds = int(bench.params["trial_rounds"])
    base = knob.ran_with(learner)
    other = knob.other(base)
    name = knob.key.rsplit(".", 1)[-1]
    cfg = _config(bench.params, f"{knob.key}={other}")
    groups, prompts, tokens = bench.batch(cfg, size)
    bench.batch(base_cfg, size)
    variant = bench.build(cfg)
    if knob.ran_with(variant) == base:  # e.g. shared prompts on a model that does not take them
        bench.say(f"trial {knob.key}: {other} runs as {base} on this model and host; not timed")
        return None
    bench.say(f"trial {knob.key}: {base} vs {other}, {size} groups ({tokens} tokens), {rounds} rounds + 1 warm-up")
    bench.say(f"trial {name}={other}: warm-up step {_timed_step(bench.ctx, variant, groups, prompts):.2f} s")
    times: dict[str, list[float]] = {base: [], other: []}
    for r in range(rounds):
        pair = [(base, learner), (other, variant)]
        for value, which in pair if r % 2 == 0 else pair[::-1]:
            times[value].append(_timed_step(bench.ctx, which, groups, prompts))
        last = f"{base} {times[base][-1]:.3f} s, {other} {times[other][-1]:.3f} s"
        bench.say(f"trial {name}: round {r + 1}/{rounds}: {last}")
        if r + 1 < rounds and clear_winner(times[base], times[other]):
            bench.say(f"trial {name}: decided after {r + 1} round(s) (one side {CLEAR_RATIO:g}x or more slower)")
            break
    del variant
    gc.collect()
    return {"key": knob.key, "values": [base, other], "times_s": [times[base], times[other]], "tokens": tokens}


def _learner(params: dict[str, Any]) -> dict[str, Any] | None:
    import torch
    from transformers import AutoConfig

    from async_rl.learner import init_distributed, teardown

    cfg = _config(params)
    ctx = init_distributed(backend="auto", timeout_s=cfg.async_training.timeouts.collective_s)
    workdir = Path(params["workdir"])
    if ctx.rank == 0:
        _model_and_records(cfg, workdir)
    ctx.barrier()
    model_path, records = _model_and_records(cfg, workdir)
    minis = max(1, cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    vocab = int(AutoConfig.from_pretrained(model_path).vocab_size)
    bench = _Bench(params, ctx, model_path, records, vocab, minis_per_step=minis)
    learner = bench.build(cfg)
    ws, threads = ctx.world_size, torch.get_num_threads()
    where = f"learner probe (world size {ws}, {threads} thread(s) per rank)"
    paired = bool(params.get("contend"))
    if paired:  # measure alone only after the generation probe has measured alone
        ctx.barrier()
        if ctx.is_rank0:
            _signal(params, "learner_up")
            _await(params, "gen_alone_done")
        ctx.barrier()
    results = []
    for size in params["batch_sizes"]:
        groups, prompts, tokens = bench.batch(cfg, size)
        times = []
        for rep in range(params["steps"] + 1):
            elapsed = _timed_step(ctx, learner, groups, prompts)
            if rep:  # the first step of each size is a warm-up
                times.append(elapsed)
            what = f"step {rep}/{params['steps']}" if rep else "warm-up step"
            bench.say(f"learner world {ws}: {size} groups ({tokens} tokens), {what}: {elapsed:.3f} s")
        step_s = median_step(times, f"{where}, {size} groups", "set the tuner's learner steps to at least 1")
        results.append({"groups": size, "tokens": tokens, "step_s": step_s, "all_s": times})
    out: dict[str, Any] = {"world_size": ws, "threads": threads, "points": results}
    if paired:
        least = int(params.get("contend_steps", CONTENDED_STEPS))
        bound_ok = bool(params.get("contend_bound_ok"))
        contended, bound = _contended(
            bench, learner, groups, prompts, results[-1]["step_s"], where, least, bound_ok=bound_ok
        )
        out["contended_step_s"], out["contended_all_s"] = statistics.median(contended), contended
        out["contended_lower_bound"] = bound
    trials = [_trial(bench, KNOBS[key], cfg, learner, params["batch_sizes"][0]) for key in params.get("trials", [])]
    out["trials"] = [t for t in trials if t is not None]
    teardown(ctx)
    return out if ctx.rank == 0 else None


def _contended(
    bench: _Bench,
    learner: Any,
    groups: list[Any],
    prompts: dict[int, list[int]],
    alone_s: float,
    where: str,
    least: int,
    *,
    bound_ok: bool,
) -> tuple[list[float], bool]:
    """Keep training ``groups`` while the generation probe runs beside it; the steps that ran entirely beside
    generation (at least ``least``), and whether they are only a lower bound. A step counts when it started after
    generation had started and ended before it stopped. With ``bound_ok`` (the ranks x threads trial), a learner so
    starved that no step ended before generation gave up returns the step in flight when it stopped (it started
    beside generation, or before and ran through all of it): it ran partly alone, so a step wholly beside generation
    takes at least as long."""
    ctx, params = bench.ctx, bench.params
    if ctx.is_rank0:
        _signal(params, "learner_alone_done", f"{alone_s}")  # the generation probe sizes its cap from it
    contended: list[float] = []
    pending: float | None = None  # the last step, timed beside generation, not yet known to have ended before it
    last: float | None = None  # the last step timed at all: at the stop, the one generation stopped during
    while True:
        flag = None
        if ctx.is_rank0:
            flag = b"stop" if _seen(params, "gen_done") else b"time" if _seen(params, "gen_started") else b"warm"
        flag = ctx.broadcast_bytes(flag)
        if flag == b"stop":  # generation stopped during the pending step: it ran partly alone
            break
        if pending is not None:
            contended.append(pending)
            bench.say(f"learner beside generation: step {len(contended)}: {pending:.3f} s (alone {alone_s:.3f} s)")
            if len(contended) == least and ctx.is_rank0:
                _signal(params, "learner_contended_enough")  # generation may stop once its seconds are up
        last = _timed_step(ctx, learner, groups, prompts)
        pending = last if flag == b"time" else None
    if not contended and bound_ok and last is not None:
        bench.say(f"learner beside generation: no step ended while it ran; the one in flight took {last:.3f} s")
        return [last], True
    fix = (
        f"generation stopped waiting after {params['contend_slowdown']:g}x the step time alone per step: the learner"
        " is starved beside vLLM here; free the machine's cores, or raise --contend-slowdown"
    )
    step_s = median_step(contended, f"{where}, beside generation", fix, least=least)
    bench.say(f"learner beside generation: {len(contended)} steps, median {step_s:.3f} s")
    return contended, False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", choices=["generation", "rollout_dtype", "learner"])
    p.add_argument("--params", required=True, help="JSON object of probe parameters")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    params = json.loads(args.params)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.probe != "learner":  # as the actor's process: drives engines only, theirs are forked from it
        from async_rl.actor import vllm_exit
        from async_rl.actor.vllm_launch import keep_torch_single_threaded

        keep_torch_single_threaded()
        vllm_exit.arm()
    try:
        if args.probe == "learner":
            result = _learner(params)
        else:
            result = asyncio.run(_generation(params) if args.probe == "generation" else _rollout_dtype(params))
    except ProbeError as err:
        print(PROBE_FAILED + str(err), flush=True)
        sys.exit(3)
    if result is not None or args.probe == "rollout_dtype":  # other learner ranks than 0 report nothing
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
