"""Preference pairs for reward-model training: read TRL's layout, check every row, render and tokenize.

A record holds a prompt (``data.prompt_key``: a string, or a list of chat messages ``{"role", "content"}``; absent =
an implicit prompt, empty), a chosen and a rejected response (a string, or a list of messages ending with an
assistant turn) and optionally a margin (a finite number). A bad row is a ``ValueError`` naming the file, the row and
the field.

Rendering follows the actor's: a plain-text prompt is encoded as is and its response encoded after it (the tokens a
policy would have produced); a chat prompt goes through the tokenizer's chat template, as the whole conversation
(prompt messages, then the response's; a string response is one assistant message), without a generation prompt, and
is encoded without added special tokens. A sequence longer than ``data.max_length`` follows ``data.truncation``
(``left``: its first tokens are cut, so the end where the score is read stays; ``drop``: the pair is left out;
``error``). The score is read at a sequence's last token, so that token must not be the pad token (the exported
sequence-classification model finds the last token as the last non-pad one): such a row is an error.

A chat-rendered sequence ends with the template's end of turn (:func:`turn_end_ids`: SmolLM2's ``<|im_end|>`` and a
newline), which a sampled response does not have (it stops at an EOS); the trainer records those tokens with its
export, so that a scorer finishes a response the same way before reading its score.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from async_rl.config.reward_model_train import BUILTIN_PREFERENCES, BUILTIN_PREFERENCES_CHAT, RewardDataConfig
from async_rl.data.files import Messages, read_messages, read_rows
from async_rl.data.toy_preferences import make_toy_preferences

__all__ = ["PreferencePair", "TokenizedPairs", "load_pairs", "parse_pair", "tokenize_pairs", "turn_end_ids"]


@dataclass(frozen=True)
class PreferencePair:
    """One checked pair; ``where`` names its file and row for later errors."""

    prompt: str | Messages
    chosen: str | Messages
    rejected: str | Messages
    margin: float
    where: str


@dataclass
class TokenizedPairs:
    """Token ids of every kept pair's two sequences, its margin, and what truncation did."""

    chosen: list[list[int]] = field(default_factory=list)
    rejected: list[list[int]] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    truncated: int = 0  # sequences cut to max_length ('left')
    dropped: int = 0  # pairs left out ('drop')
    chat: int = 0  # kept pairs rendered through the chat template (the others are plain text)

    def __len__(self) -> int:
        return len(self.chosen)


def _response(value: Any, where: str, key: str, chat_prompt: bool) -> str | Messages:
    if value is None:
        raise ValueError(f"{where}: record has no field {key!r}")
    if isinstance(value, str):
        if not value:
            raise ValueError(f"{where}: field {key!r} is an empty string")
        return value
    if not isinstance(value, list):
        raise ValueError(f"{where}: field {key!r} must be a string or a list of messages, got {type(value).__name__}")
    if not chat_prompt:
        raise ValueError(f"{where}: field {key!r} is a message list but the prompt is plain text; use one form")
    messages = read_messages(value, where, key)
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"{where}: field {key!r} must end with an assistant message, got {messages[-1]['role']!r}")
    return messages


def parse_pair(raw: Mapping[str, Any], where: str, d: RewardDataConfig) -> PreferencePair:
    """Check one record (see the module docstring) against the field names of ``d``."""
    prompt: str | Messages
    value = raw.get(d.prompt_key)
    if value is None:
        chat = any(isinstance(raw.get(k), list) for k in (d.chosen_key, d.rejected_key))
        prompt = [] if chat else ""
    elif isinstance(value, str):
        prompt = value
    elif isinstance(value, list):
        prompt = read_messages(value, where, d.prompt_key)
    else:
        raise ValueError(
            f"{where}: field {d.prompt_key!r} must be a string or a list of messages, got {type(value).__name__}"
        )
    chat = isinstance(prompt, list)
    chosen = _response(raw.get(d.chosen_key), where, d.chosen_key, chat)
    rejected = _response(raw.get(d.rejected_key), where, d.rejected_key, chat)
    margin = raw.get(d.margin_key, 0.0)
    if margin is None:
        margin = 0.0
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not math.isfinite(margin):
        raise ValueError(f"{where}: field {d.margin_key!r} must be a finite number, got {margin!r}")
    return PreferencePair(prompt, chosen, rejected, float(margin), where)


def load_pairs(files: str | list[str], d: RewardDataConfig, *, split: str) -> list[PreferencePair]:
    """Every pair of ``files`` (``split`` picks the builtin toy set's half), checked."""
    pairs: list[PreferencePair] = []
    for f in [files] if isinstance(files, str) else files:
        if f in (BUILTIN_PREFERENCES, BUILTIN_PREFERENCES_CHAT):
            records = make_toy_preferences(split=split, chat=f == BUILTIN_PREFERENCES_CHAT, seed=d.seed)
            rows = [(f"{f} ({split}) pair {i}", r) for i, r in enumerate(records)]
        else:
            rows = read_rows(f)
        pairs.extend(parse_pair(raw, where, d) for where, raw in rows)
    if not pairs:
        raise ValueError(f"no preference pairs in {files!r}")
    return pairs


def _encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    if not texts:
        return []
    return [[int(t) for t in row] for row in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _chat_text(tokenizer: Any, prompt: Messages, response: str | Messages, where: str) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{where}: chat messages need a chat template and the tokenizer has none: set model.custom_chat_template"
        )
    reply = [{"role": "assistant", "content": response}] if isinstance(response, str) else response
    return str(tokenizer.apply_chat_template([*prompt, *reply], tokenize=False, add_generation_prompt=False))


def turn_end_ids(tokenizer: Any) -> list[int] | None:
    """The tokens the chat template renders after an assistant message's content, or None when they cannot be told
    apart (no template, or a template whose generation prompt is not a prefix of the rendered conversation).

    Found by rendering one exchange both ways: the prompt with its generation prompt (what the actor samples after),
    then the whole conversation (what the trainer scores); what follows the reply's own tokens is the turn's end."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    user = [{"role": "user", "content": "1"}]
    reply = "1"
    head = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": reply}], tokenize=False, add_generation_prompt=False
    )
    head_ids, reply_ids, whole_ids = _encode(tokenizer, [str(head), reply, str(whole)])
    start = len(head_ids) + len(reply_ids)
    if whole_ids[:start] != head_ids + reply_ids:
        return None
    return whole_ids[start:]


def _sequences(tokenizer: Any, pairs: Sequence[PreferencePair], side: str) -> list[list[int]]:
    """The token ids of each pair's ``side`` ('chosen' or 'rejected') sequence, rendered as the module says."""
    responses = [getattr(p, side) for p in pairs]
    chat = [i for i, p in enumerate(pairs) if isinstance(p.prompt, list)]
    plain = [i for i, p in enumerate(pairs) if not isinstance(p.prompt, list)]
    out: list[list[int]] = [[] for _ in pairs]
    texts = []
    for i in chat:
        prompt = pairs[i].prompt
        assert isinstance(prompt, list)
        texts.append(_chat_text(tokenizer, prompt, responses[i], pairs[i].where))
    for i, ids in zip(chat, _encode(tokenizer, texts), strict=True):
        out[i] = ids
    prompts = _encode(tokenizer, [str(pairs[i].prompt) for i in plain])
    replies = _encode(tokenizer, [str(responses[i]) for i in plain])
    for i, p_ids, r_ids in zip(plain, prompts, replies, strict=True):
        out[i] = p_ids + r_ids
    return out


def tokenize_pairs(
    tokenizer: Any, pairs: Sequence[PreferencePair], d: RewardDataConfig, *, pad_token_id: int
) -> TokenizedPairs:
    """Render and tokenize every pair; apply ``d.max_length`` / ``d.truncation``; check the last tokens."""
    sides = {side: _sequences(tokenizer, pairs, side) for side in ("chosen", "rejected")}
    out = TokenizedPairs()
    for i, pair in enumerate(pairs):
        kept: dict[str, list[int]] = {}
        for side, seqs in sides.items():
            ids, key = seqs[i], getattr(d, f"{side}_key")
            if not ids:
                raise ValueError(f"{pair.where}: field {key!r} renders to no tokens")
            if len(ids) > d.max_length:
                if d.truncation == "error":
                    raise ValueError(
                        f"{pair.where}: field {key!r} renders to {len(ids)} tokens > data.max_length={d.max_length};"
                        " set data.truncation=left or drop"
                    )
                if d.truncation == "left":
                    ids = ids[-d.max_length :]
                    out.truncated += 1
            if ids[-1] == pad_token_id:
                raise ValueError(
                    f"{pair.where}: field {key!r} ends with the pad token (id {pad_token_id}), where its score would be"
                    " read; the exported model could not find that position"
                )
            kept[side] = ids
        if any(len(ids) > d.max_length for ids in kept.values()):  # 'drop'
            out.dropped += 1
            continue
        out.chosen.append(kept["chosen"])
        out.rejected.append(kept["rejected"])
        out.margins.append(pair.margin)
        out.chat += isinstance(pair.prompt, list)
    if not out.chosen:
        raise ValueError(f"every pair is longer than data.max_length={d.max_length} (data.truncation=drop)")
    return out
