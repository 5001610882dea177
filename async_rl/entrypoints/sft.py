"""Supervised fine-tuning entry point: train a causal LM on demonstrations (loss on the assistant's tokens only), on
the FSDP2 learner.

Two ranks on one machine (or one plain process without torchrun)::

    torchrun --standalone --nproc-per-node 2 -m async_rl.entrypoints.sft --config configs/sft/tiny_arith.yaml
    python -m async_rl.entrypoints.sft data.train_files=demos.jsonl data.val_files=held_out.jsonl

``--dry-run`` validates the config, loads and renders the records (every bad row is an error naming its file, row and
field) and prints the run's plan, without building the model. ``--help`` lists every key. See docs/sft.md.

With ``trainer.save_freq=N`` a checkpoint is written every N steps; rerunning the same command resumes from the newest
one (``trainer.resume_mode=auto``). On SIGTERM every rank stops after its current step, checkpoints (when save_freq
> 0) and exits 143 (128 + SIGTERM).
"""

from __future__ import annotations

import json

from async_rl.config.sft import SFTConfig, validate_sft_config
from async_rl.entrypoints._exit import exit_without_finalization, tree_main


def dry_run(cfg: SFTConfig) -> int:
    """Load and render the records with the model's tokenizer and print the plan (no model is built)."""
    from async_rl.data.sft import load_sft_records, tokenize_sft
    from async_rl.runtime import resources
    from async_rl.runtime.supervised import load_tokenizer, supervised_run_dir

    out = supervised_run_dir(cfg.trainer)
    path = resources.resolve_model_path(cfg.model.partial_pretrain, out)
    tokenizer = load_tokenizer(path, cfg.model.custom_chat_template)
    d = cfg.data
    plan: dict[str, object] = {"model": cfg.model.partial_pretrain, "run_dir": str(out)}
    for split, files in (("train", d.train_files), ("validation", d.val_files)):
        if files is not None:
            rows = tokenize_sft(tokenizer, load_sft_records(files, d, split="train" if split == "train" else "eval"), d)
            plan[split] = {
                "rows": len(rows),
                "chat_rendered": rows.chat,
                "truncated": rows.truncated,
                "demonstrated_tokens": sum(ex.trained_tokens for ex in rows.examples),
                "longest": max(len(ex.prompt_ids) + len(ex.response_ids) for ex in rows.examples),
            }
    print(json.dumps(plan, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return tree_main(SFTConfig, validate_sft_config, argv, dry_run=dry_run, run=_run)


def _run(cfg: SFTConfig) -> dict[str, object]:
    from async_rl.runtime import sft_trainer

    return sft_trainer.run_sft(cfg)


if __name__ == "__main__":
    exit_without_finalization(main())
