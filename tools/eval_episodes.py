"""Play a config's multi-turn episodes on its validation prompts with the real actor path, and report how they went.

    python tools/eval_episodes.py --config configs/smollm2_calculator_tool_grpo.yaml [--prompts 16] [--n 4]
        [--temperature T] [--show 2] [--model DIR] [key=value ...]

The same pieces as a training actor: vLLM (``GenerationEngine``), the environment in its sandboxed worker
(``EnvWorker``) and the token-exact renderer (``EpisodeRunner``). Use it to see what an untrained (or trained:
``--model`` names an exported HF directory) policy does before spending a run on it: the success rate (the
environment's ``solved`` where it reports one, else reward > 0), the reward, turns, tool calls and errors, the
template check, and a few transcripts exactly as the learner would see them (the observation tokens in [brackets]).
Temperature defaults to the config's validation temperature.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--prompts", type=int, default=16, help="validation prompts to play")
    p.add_argument("--n", type=int, default=4, help="episodes per prompt")
    p.add_argument("--temperature", type=float, default=None, help="default: the config's val_kwargs.temperature")
    p.add_argument("--show", type=int, default=2, help="transcripts to print")
    p.add_argument("--model", default=None, help="policy directory (default: the config's model)")
    p.add_argument("--json", default=None, help="also write the summary here")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, key=value")
    return p.parse_args()


def transcript(tokenizer: Any, completion: Any) -> str:
    """The episode's response with the observation (loss-mask 0) tokens in [brackets]."""
    from async_rl.transport.protocol import unpack_array

    tokens = unpack_array(completion.token_ids).tolist()
    mask = unpack_array(completion.loss_mask).tolist() if completion.loss_mask is not None else [1] * len(tokens)
    out, run, cur = [], [], mask[0] if mask else 1
    for t, m in zip(tokens, mask, strict=True):
        if m != cur:
            text = tokenizer.decode(run)
            out.append(text if cur else f"[{text}]")
            run, cur = [], m
        run.append(t)
    if run:
        text = tokenizer.decode(run)
        out.append(text if cur else f"[{text}]")
    return "".join(out)


async def _play(cfg: Any, model_path: str, args: argparse.Namespace) -> dict[str, Any]:
    import msgspec

    from async_rl.actor.engine import GenerationEngine, actor_device
    from async_rl.config.resolve import engine_start
    from async_rl.runtime import resources
    from async_rl.runtime.actor_main import episode_runner
    from async_rl.runtime.rollout_metrics import episode_metrics
    from async_rl.transport.protocol import GroupSampling, PromptGrant, RolloutGroup, pack_array

    tokenizer = resources.load_tokenizer(cfg, model_path)
    records, _ = resources.val_records(cfg, tokenizer)
    records = records[: args.prompts]
    start = engine_start(cfg, model_path=model_path, device_type=actor_device())
    engine = GenerationEngine(cfg, start, extra_engine_kwargs={})
    await engine.start()
    runner = episode_runner(cfg, engine, model_path)
    try:
        sampling = GroupSampling.from_config(cfg, seed=cfg.trainer.seed)
        temperature = args.temperature
        if temperature is None:
            temperature = cfg.actor_rollout_ref.rollout.val_kwargs.temperature
        sampling = msgspec.structs.replace(sampling, n=args.n, temperature=temperature)
        started = time.monotonic()
        groups = await asyncio.gather(
            *(
                runner.run_group(
                    PromptGrant(i, i + 1, 0, pack_array(r.token_ids, "<i4"), sampling, dict(r.extras)),
                    r.token_ids.tolist(),
                )
                for i, r in enumerate(records)
            )
        )
        elapsed = time.monotonic() - started
    finally:
        runner.close()
        await engine.shutdown()
    completions = [c for g in groups if g is not None for c in g]
    wire = [
        RolloutGroup(prompt_id=i, lease_id=1, actor_id="eval", completions=list(g or [])) for i, g in enumerate(groups)
    ]
    rewards = [c.reward for c in completions]
    # The environment's own verdict where it reports one (info["solved"], e.g. the guessing game, whose shaped
    # reward is above 0 for a lost game too), else reward > 0.
    solved = [(c.reward_components or {}).get("solved", float(c.reward > 0)) for c in completions]
    summary = {
        "model": model_path,
        "prompts": len(records),
        "episodes": len(completions),
        "temperature": temperature,
        "success_rate": sum(solved) / max(len(solved), 1),
        "reward_mean": sum(rewards) / max(len(rewards), 1),
        "finish": {
            k: sum(c.finish_reason == k for c in completions) for k in sorted({c.finish_reason for c in completions})
        },
        "seconds": round(elapsed, 1),
        **episode_metrics(wire),
    }
    for c in completions[: args.show]:
        print(f"--- reward {c.reward} finish {c.finish_reason}\n{transcript(tokenizer, c)}\n")
    return summary


def main() -> None:
    args = _parse()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from async_rl.config import load_config
    from async_rl.runtime import resources

    cfg = load_config(args.config, args.overrides)
    if not cfg.actor_rollout_ref.rollout.multi_turn.enable:
        raise SystemExit(f"{args.config}: actor_rollout_ref.rollout.multi_turn.enable is false: nothing to play")
    workdir = resources.run_dir(cfg)
    workdir.mkdir(parents=True, exist_ok=True)
    model_path = args.model or resources.resolve_model_path(cfg.actor_rollout_ref.model.path, workdir)
    summary = asyncio.run(_play(cfg, model_path, args))
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
