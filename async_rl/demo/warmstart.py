"""Supervised warm-start and greedy evaluation for the embedded arithmetic demo.

RL can only sharpen what a policy can already sometimes do, so the demo first gives the freshly built tiny model a short
supervised pass on ``prompt + answer + <eos>`` (loss on the answer and eos only). Two measured facts shape the default
recipe (1000 steps of 128 problems, ~35 s on 2 CPU cores):

* **Learning rate.** A 2-layer model learns carries abruptly, and at lr 3e-3 whether it does so within a few hundred
  steps depends on the seed (600 steps gave 81% held-out greedy accuracy for one seed, 5-10% for two others). Peak lr
  1e-3 with a short linear warm-up and cosine decay reaches 87-98% for every seed tried (0-3) in 800-1000 steps.
* **Label smoothing over characters.** Without it the sampled (T=1) errors of the warm model are confusions between
  plausible digits: which digit is right differs per prompt, so the policy gradient of a batch mostly points at that
  batch's prompts and RL improves the sampled reward only slowly. With ``label_smoothing = eps`` the target is
  ``(1 - eps) * one_hot + eps * uniform(character tokens)`` -- the expected loss of imitating demonstrations that
  contain a random typo with probability ``eps`` per character. The warm model keeps its argmax (eps = 0.3: 90-95%
  held-out greedy accuracy for seeds 0-2) but samples such typos (sampled reward ~0.2); removing them is the same
  direction for every prompt, which GRPO learns within a few hundred steps (see configs/demo_grpo.yaml). Special
  tokens (pad/bos/eos/unk) and the model's spare vocabulary rows get no smoothing mass, so sampling never produces
  ids the tokenizer cannot decode.

Evaluation decodes greedily with a plain batched loop (the model is tiny; no vLLM engine needed) and reports
exact-match accuracy on held-out problems.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "WARMSTART_LR",
    "WARMSTART_PROBLEMS",
    "character_token_ids",
    "greedy_accuracy",
    "prepare_warm_model",
    "sft_loss",
    "warm_start",
    "warmup_cosine",
]

WARMSTART_PROBLEMS = 20000  # size of the generated supervised set (train split, seed 0, 2-digit operands)
WARMSTART_LR = 1e-3  # peak lr of the recipe (see the module docstring)


def _encode_sft(tokenizer: Any, problems: list[dict[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids [B, L]`` and ``loss_mask [B, L]`` (1 on answer + eos tokens)."""
    rows: list[list[int]] = []
    masks: list[list[int]] = []
    for p in problems:
        prompt = tokenizer(p["prompt"], add_special_tokens=False)["input_ids"]
        answer = tokenizer(p["ground_truth"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        masks.append([0] * len(prompt) + [1] * len(answer))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (r, m) in enumerate(zip(rows, masks, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids, mask


def character_token_ids(tokenizer: Any) -> list[int]:
    """Ids of the tokenizer's ordinary (non-special) tokens: where label smoothing puts its mass."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def warmup_cosine(step: int, *, steps: int, warmup_steps: int) -> float:
    """LR multiplier for 0-based ``step``: linear ``(step + 1) / warmup_steps`` warm-up, then cosine decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def sft_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    *,
    label_smoothing: float = 0.0,
    smooth_ids: list[int] | None = None,
) -> torch.Tensor:
    """Masked mean next-token loss; ``logits [B, L, V]`` predict ``targets [B, L]`` where ``mask [B, L]`` is 1.

    Per token: ``(1 - eps) * (-log p(target)) + eps * mean_{c in smooth_ids}(-log p(c))`` with
    ``eps = label_smoothing`` (cross-entropy against the smoothed target distribution).
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    logp = logits.float().log_softmax(-1)
    token_loss = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if label_smoothing > 0.0:
        if not smooth_ids:
            raise ValueError("smooth_ids must name at least one token id when label_smoothing > 0")
        uniform = -logp[..., torch.as_tensor(smooth_ids, dtype=torch.long)].mean(-1)
        token_loss = (1.0 - label_smoothing) * token_loss + label_smoothing * uniform
    weights = mask.to(token_loss.dtype)
    return (token_loss * weights).sum() / weights.sum().clamp(min=1.0)


def warm_start(
    model_dir: str | Path,
    problems: list[dict[str, str]],
    *,
    lr: float,
    seed: int,
    steps: int = 1000,
    batch_size: int = 128,
    warmup_steps: int = 50,
    label_smoothing: float = 0.3,
    log_every: int = 50,
) -> dict[str, float]:
    """Supervised pass over ``problems``; overwrites the checkpoint in ``model_dir``. Returns final loss and time.

    AdamW (no weight decay) at peak ``lr`` with ``warmup_steps`` linear warm-up then cosine decay to 0, gradient norm
    clipped to 1, batches of ``batch_size`` problems drawn with replacement from a generator seeded with ``seed``.
    See the module docstring for why these defaults and what ``label_smoothing`` does.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got steps={steps}, batch_size={batch_size}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if not problems:
        raise ValueError("problems must not be empty")
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    ids, mask = _encode_sft(tokenizer, problems)
    smooth_ids = character_token_ids(tokenizer)
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: warmup_cosine(s, steps=steps, warmup_steps=warmup_steps))
    gen = torch.Generator().manual_seed(seed)
    started = time.monotonic()
    loss_value = float("nan")
    for step in range(1, steps + 1):
        pick = torch.randint(0, len(ids), (batch_size,), generator=gen)
        batch, batch_mask = ids[pick], mask[pick]
        logits = model(input_ids=batch, attention_mask=(batch != tokenizer.pad_token_id).long()).logits[:, :-1]
        loss = sft_loss(logits, batch[:, 1:], batch_mask[:, 1:], label_smoothing=label_smoothing, smooth_ids=smooth_ids)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        loss_value = loss.item()
        if log_every and step % log_every == 0:
            logger.info("warm-start step %d/%d loss %.4f", step, steps, loss_value)
    model.save_pretrained(model_dir)
    return {"warmstart/loss": loss_value, "warmstart/seconds": time.monotonic() - started, "warmstart/steps": steps}


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
    model_dir: str | Path,
    *,
    steps: int = 1000,
    held_out: list[dict[str, str]] | None = None,
    log_every: int = 100,
) -> dict[str, float]:
    """Build the tiny model into ``model_dir`` (seed 0) and warm-start it on the demo's generated training problems.

    The one recipe shared by the demo and the staleness sweep, so both start RL from the same kind of model. With
    ``held_out`` problems, greedy exact-match accuracy is measured before (``heldout_greedy_accuracy_raw``) and after
    (``heldout_greedy_accuracy``) the warm-start; the other keys are :func:`warm_start`'s.
    """
    from async_rl.data import make_arith_problems
    from async_rl.models.tiny import build_tiny_model

    build_tiny_model(model_dir, seed=0)
    result: dict[str, float] = {}
    if held_out is not None:
        result["heldout_greedy_accuracy_raw"] = greedy_accuracy(model_dir, held_out)
    train = make_arith_problems(WARMSTART_PROBLEMS, seed=0, digits=2, split="train")
    result.update(warm_start(model_dir, train, lr=WARMSTART_LR, seed=0, steps=steps, log_every=log_every))
    if held_out is not None:
        result["heldout_greedy_accuracy"] = greedy_accuracy(model_dir, held_out)
    return result
