"""The embedded arithmetic demo's warm start and its greedy evaluation.

RL can only sharpen what a policy can already sometimes do, so the demo (and the staleness sweep) first gives the
freshly built tiny model a short supervised pass: :func:`prepare_warm_model` runs the SFT entry point
(``async_rl.entrypoints.sft``, the FSDP2 learner) on ``configs/sft/demo_warmstart.yaml``, whose comments say why its
learning rate and label smoothing are what they are.

Evaluation decodes greedily with a plain batched loop (the model is tiny; no vLLM engine needed) and reports
exact-match accuracy on held-out problems.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from async_rl import metric_catalog as mc
from async_rl.runtime import resources
from async_rl.runtime.metrics import read_metrics
from async_rl.runtime.supervised import EXPORT_DIR

logger = logging.getLogger(__name__)

__all__ = ["WARMSTART_CONFIG", "greedy_accuracy", "prepare_warm_model"]

WARMSTART_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "sft" / "demo_warmstart.yaml"
"""The warm start's SFT config (1,000 steps of 128 problems at lr 1e-3, label smoothing 0.3)."""


@torch.no_grad()
def greedy_accuracy(
    model_or_dir: Any, problems: list[dict[str, str]], *, max_new_tokens: int = 8, batch_size: int = 256
) -> float:
    """Exact-match accuracy of greedy decoding on ``problems`` (answer = text before the first eos)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(model_or_dir, str | Path):
        tokenizer = AutoTokenizer.from_pretrained(model_or_dir)
        model = AutoModelForCausalLM.from_pretrained(model_or_dir, dtype=torch.float32)
    else:
        model, tokenizer = model_or_dir
    model.eval()
    correct = 0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        prompts = [tokenizer(p["prompt"], add_special_tokens=False)["input_ids"] for p in chunk]
        width = max(len(p) for p in prompts)
        # Left-pad so every row's next token is predicted at the last position.
        ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            attn[i, width - len(p) :] = 1
        done = torch.zeros(len(chunk), dtype=torch.bool)
        generated: list[list[int]] = [[] for _ in chunk]
        for _ in range(max_new_tokens):
            position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits[:, -1]
            nxt = logits.argmax(-1)
            for i, tok in enumerate(nxt.tolist()):
                if not done[i]:
                    if tok == tokenizer.eos_token_id:
                        done[i] = True
                    else:
                        generated[i].append(tok)
            if bool(done.all()):
                break
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        for p, g in zip(chunk, generated, strict=True):
            correct += int(str(tokenizer.decode(g)).strip() == p["ground_truth"])
    return correct / max(len(problems), 1)


def prepare_warm_model(
    run_dir: str | Path, *, steps: int, held_out: list[dict[str, str]] | None
) -> tuple[Path, dict[str, float]]:
    """Build the tiny model (seed 0) and warm-start it for ``steps`` SFT steps of :data:`WARMSTART_CONFIG` in
    ``run_dir`` (its log: ``run_dir/sft.log``). Returns the warm model's directory and a summary: ``warmstart/steps``,
    ``warmstart/seconds``, ``warmstart/loss`` (the last step's training loss) and, with ``held_out`` problems, greedy
    exact-match accuracy before (``heldout_greedy_accuracy_raw``) and after (``heldout_greedy_accuracy``).

    The one recipe shared by the demo and the staleness sweep, so both start RL from the same kind of model.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "async_rl.entrypoints.sft",
        "--config",
        str(WARMSTART_CONFIG),
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
    ]
    log_path = run_dir / "sft.log"
    logger.info("warm start: %d SFT steps of %s (log: %s)", steps, WARMSTART_CONFIG.name, log_path)
    started = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"the warm start failed (exit {proc.returncode}); the end of {log_path}:\n{tail}")
    losses = [r[mc.SFT_TRAIN_LOSS] for r in read_metrics(run_dir / "metrics.jsonl") if mc.SFT_TRAIN_LOSS in r]
    result = {
        "warmstart/steps": float(steps),
        "warmstart/seconds": time.monotonic() - started,
        "warmstart/loss": losses[-1],
    }
    model_dir = run_dir / EXPORT_DIR
    if held_out is not None:
        untrained = resources.resolve_model_path(resources.BUILTIN_MODEL, run_dir)  # the one SFT built and trained
        result["heldout_greedy_accuracy_raw"] = greedy_accuracy(untrained, held_out)
        result["heldout_greedy_accuracy"] = greedy_accuracy(model_dir, held_out)
    return model_dir, result
