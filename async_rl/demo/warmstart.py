"""Supervised warm-start and greedy evaluation for the embedded arithmetic demo.

RL can only sharpen what a policy can already sometimes do, so the demo first gives the freshly built tiny model a short
supervised pass on ``prompt + answer + <eos>`` (loss on the answer and eos only). A few hundred steps leave it
imperfect but able, which is where GRPO has signal to work with. Evaluation decodes greedily with a plain batched loop
(the model is tiny; no vLLM engine needed) and reports exact-match accuracy on held-out problems.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


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


def warm_start(
    model_dir: str | Path,
    problems: list[dict[str, str]],
    *,
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    log_every: int = 50,
) -> dict[str, float]:
    """Supervised pass over ``problems``; overwrites the checkpoint in ``model_dir``. Returns final loss and time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got steps={steps}, batch_size={batch_size}")
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    ids, mask = _encode_sft(tokenizer, problems)
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    gen = torch.Generator().manual_seed(seed)
    started = time.monotonic()
    loss_value = float("nan")
    for step in range(1, steps + 1):
        pick = torch.randint(0, len(ids), (batch_size,), generator=gen)
        batch, batch_mask = ids[pick], mask[pick]
        logits = model(input_ids=batch, attention_mask=(batch != tokenizer.pad_token_id).long()).logits[:, :-1]
        token_loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="none"
        ).view(batch.shape[0], -1)
        target_mask = batch_mask[:, 1:]
        loss = (token_loss * target_mask).sum() / target_mask.sum()
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
