"""Reward-model entry point: train a Bradley-Terry reward model on preference pairs, on the FSDP2 learner.

Two ranks on one machine (or one plain process without torchrun)::

    torchrun --standalone --nproc-per-node 2 -m async_rl.entrypoints.train_reward_model \\
        --config configs/reward_model/smollm2_toy.yaml trainer.total_training_steps=20
    python -m async_rl.entrypoints.train_reward_model data.train_files=pairs.jsonl data.val_files=held_out.jsonl

``--dry-run`` validates the config, loads and tokenizes the pairs (every bad row is an error naming its file, row and
field) and prints the run's plan, without building the model. ``--help`` lists every key. See docs/reward_models.md.

With ``trainer.save_freq=N`` a checkpoint is written every N steps; rerunning the same command resumes from the newest
one (``trainer.resume_mode=auto``). On SIGTERM every rank stops after its current step, checkpoints (when save_freq
> 0) and exits 143 (128 + SIGTERM).
"""

from __future__ import annotations

import json

from async_rl.config.reward_model_train import RewardModelTrainConfig, validate_reward_model_config
from async_rl.entrypoints._exit import exit_without_finalization, tree_main


def dry_run(cfg: RewardModelTrainConfig) -> int:
    """Load and tokenize the pairs with the model's tokenizer and print the plan (no model is built)."""
    from async_rl.data.preferences import load_pairs, tokenize_pairs
    from async_rl.runtime import resources
    from async_rl.runtime.reward_model_trainer import load_tokenizer, run_dir

    out = run_dir(cfg)
    tokenizer = load_tokenizer(resources.resolve_model_path(cfg.model.path, out), cfg.model.custom_chat_template)
    d = cfg.data
    plan: dict[str, object] = {"model": cfg.model.path, "run_dir": str(out)}
    for split, files in (("train", d.train_files), ("eval", d.val_files)):
        if files is not None:
            pairs = tokenize_pairs(
                tokenizer, load_pairs(files, d, split=split), d, pad_token_id=int(tokenizer.pad_token_id)
            )
            longest = max(len(s) for s in (*pairs.chosen, *pairs.rejected))
            plan[split] = {
                "pairs": len(pairs),
                "truncated": pairs.truncated,
                "dropped": pairs.dropped,
                "longest": longest,
            }
    print(json.dumps(plan, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return tree_main(RewardModelTrainConfig, validate_reward_model_config, argv, dry_run=dry_run, run=_run)


def _run(cfg: RewardModelTrainConfig) -> dict[str, object]:
    from async_rl.runtime import reward_model_trainer

    return reward_model_trainer.run_reward_model_training(cfg)


if __name__ == "__main__":
    exit_without_finalization(main())
