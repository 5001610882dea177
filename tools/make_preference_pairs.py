"""Make preference pairs from a policy's own samples, ranked by a gold scorer (for reward-model studies).

    python tools/make_preference_pairs.py --config configs/smollm2_arith_rm_gold.yaml --out DIR
        [--train-prompts 512] [--eval-prompts 128] [--n 4] [--max-pairs 2] [--temperature T] [--model DIR]
        [key=value ...]

The config's policy (``actor_rollout_ref.model.path``, or ``--model``) samples ``--n`` responses to each prompt with
the actors' vLLM engine (``GenerationEngine``, the config's rollout settings; temperature: the rollout's unless
given); the config's reward function (``reward.function``, here the gold scorer, run in its sandboxed worker as on an
actor) scores them; :func:`async_rl.data.ranked_pairs.ranked_pairs` turns each prompt's samples into up to
``--max-pairs`` (chosen, rejected) pairs. Training pairs come from the first ``--train-prompts`` prompts of
``data.train_files``, held-out pairs from the first ``--eval-prompts`` of ``data.val_files``, so the reward model is
evaluated on prompts it never trained on. Writes ``DIR/train.jsonl``, ``DIR/eval.jsonl`` (TRL's layout, what the
reward-model trainer reads: ``data.train_files`` / ``data.val_files``) and ``DIR/summary.json`` (counts, the
samples' gold mean, seconds).
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


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True, help="directory for train.jsonl, eval.jsonl and summary.json")
    p.add_argument("--train-prompts", type=int, default=512, help="prompts of data.train_files to sample")
    p.add_argument("--eval-prompts", type=int, default=128, help="prompts of data.val_files to sample")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-pairs", type=int, default=2, help="pairs per prompt at most")
    p.add_argument("--temperature", type=float, default=None, help="default: the config's rollout temperature")
    p.add_argument("--model", default=None, help="policy directory (default: the config's model)")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, key=value")
    return p.parse_args(argv)


async def _sample(cfg: Any, model_path: str, prompts: list[list[int]], n: int, temperature: float) -> list[list[str]]:
    """``n`` sampled response texts for each prompt (token ids), all prompts in flight at once."""
    import msgspec

    from async_rl.actor.engine import GenerationEngine, actor_device
    from async_rl.config.resolve import engine_start
    from async_rl.transport.protocol import GroupSampling

    start = engine_start(cfg, model_path=model_path, device_type=actor_device())
    engine = GenerationEngine(cfg, start, extra_engine_kwargs={})
    await engine.start()
    try:
        sampling = GroupSampling.from_config(cfg, seed=cfg.trainer.seed)
        sampling = msgspec.structs.replace(sampling, n=n, temperature=temperature)
        done = 0

        async def one(ids: list[int]) -> list[str]:
            nonlocal done
            outputs = await engine.generate(ids, sampling)
            done += 1
            if done % 64 == 0 or done == len(prompts):
                print(f"  sampled {done}/{len(prompts)} prompts", flush=True)
            return [o.text for o in outputs]

        return list(await asyncio.gather(*(one(ids) for ids in prompts)))
    finally:
        await engine.shutdown()


def score_and_pair(
    rows: list[dict[str, Any]], prompt_texts: list[str], texts: list[list[str]], worker: Any, max_pairs: int
) -> dict[str, Any]:
    """Gold-score each prompt's samples and pair them; the pairs and the split's counts."""
    from async_rl.data.ranked_pairs import ranked_pairs

    pairs: list[dict[str, Any]] = []
    golds: list[float] = []
    paired_prompts = 0
    for row, prompt_text, samples in zip(rows, prompt_texts, texts, strict=True):
        scores = [worker.score(prompt_text, t, row["ground_truth"], row["extra"]).score for t in samples]
        golds.extend(scores)
        made = ranked_pairs(row["prompt"], list(zip(samples, scores, strict=True)), max_pairs=max_pairs)
        paired_prompts += bool(made)
        pairs.extend(made)
    return {
        "pairs": pairs,
        "prompts": len(rows),
        "samples": len(golds),
        "gold_mean": round(sum(golds) / max(len(golds), 1), 4),
        "num_pairs": len(pairs),
        "prompts_with_a_pair": paired_prompts,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from async_rl.config import load_config
    from async_rl.runtime import resources
    from async_rl.runtime.actor_main import reward_worker

    cfg = load_config(args.config, args.overrides)
    d = cfg.data
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = resources.run_dir(cfg)
    workdir.mkdir(parents=True, exist_ok=True)
    model_path = args.model or resources.resolve_model_path(cfg.actor_rollout_ref.model.path, workdir)
    tokenizer = resources.load_tokenizer(cfg, model_path)
    splits = {
        "train": resources.load_raw_records(d.train_files, d.prompt_key, "train", d.seed)[: args.train_prompts],
        "eval": resources.load_raw_records(d.val_files, d.prompt_key, "eval", d.seed)[: args.eval_prompts],
    }
    for split, rows in splits.items():
        if not rows:
            raise SystemExit(f"no {split} prompts (data.{'train' if split == 'train' else 'val'}_files)")
    everything = [r for rows in splits.values() for r in rows]
    ids = resources.tokenize_prompts(tokenizer, [r["prompt"] for r in everything])
    temperature = cfg.actor_rollout_ref.rollout.temperature if args.temperature is None else args.temperature
    print(f"sampling {args.n} responses to each of {len(everything)} prompts at temperature {temperature}", flush=True)
    started = time.monotonic()
    texts = asyncio.run(_sample(cfg, model_path, ids, args.n, temperature))
    summary: dict[str, Any] = {"model": model_path, "gold": cfg.reward.function, "n": args.n}
    summary["sampling_seconds"] = round(time.monotonic() - started, 1)
    prompt_texts = tokenizer.batch_decode(ids)
    offset = 0
    with reward_worker(cfg) as worker:
        for split, rows in splits.items():
            part = slice(offset, offset + len(rows))
            offset += len(rows)
            result = score_and_pair(rows, prompt_texts[part], texts[part], worker, args.max_pairs)
            with (out / f"{split}.jsonl").open("w") as f:
                for pair in result.pop("pairs"):
                    f.write(json.dumps(pair) + "\n")
            summary[split] = result
            print(f"{split}: {json.dumps(result)}", flush=True)
    summary["seconds"] = round(time.monotonic() - started, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"pairs written to {out}/train.jsonl and {out}/eval.jsonl ({summary['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
