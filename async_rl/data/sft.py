"""Supervised fine-tuning data: read the records, check every row, render and tokenize them as the actor would.

Three record forms, chosen by the config (``data.multiturn.enable``) and by the prompt's type:

* **plain text** (``data.prompt_key`` a string, ``data.response_key`` a string): the prompt is encoded as is and the
  response encoded after it, then the tokenizer's EOS: what a policy samples after a plain prompt until it stops;
* **chat** (the prompt a list of messages ``{"role", "content"}``, the response a string): one exchange, the response
  being the assistant's reply;
* **multi-turn** (``data.multiturn.messages_key``: a whole conversation, with tool calls written in the assistant
  turns and tool results in the messages after them, as the environments' episodes have them).

A chat conversation is rendered token for token as the multi-turn actor renders an episode
(:class:`~async_rl.actor.chat_render.ChatRenderer`): the prompt is the messages before the first assistant turn with
the generation prompt; each assistant turn is its content's tokens followed by the part of the template's closer that
the model samples (up to and including the EOS token, ``<|im_end|>`` for ChatML); after it come the rest of the closer,
the next messages and the next generation prompt, as the actor appends them. The loss mask is 1 on the assistant
turns' tokens only, so SFT trains exactly the tokens the actor will later sample, and nothing the environment wrote.

The learner's layout is the rollout's: the prompt, then a "response" (everything from the first assistant turn) with
its loss mask. A row longer than ``data.max_length`` follows ``data.truncation`` (verl's values): ``error`` stops with
an error naming the file and row, ``left`` cuts the prompt's first tokens, ``right`` cuts the conversation's end. A
row with no trained token left is an error (it would teach nothing and mean nothing in the loss).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from async_rl.actor.chat_render import ChatRenderer
from async_rl.config.actor_rollout_ref import MultiTurnConfig
from async_rl.config.sft import BUILTIN_ARITH_SFT, BUILTIN_ARITH_SFT_CHAT, BUILTIN_CALCULATOR_SFT, SFTDataConfig
from async_rl.data.arith import ARITH_EVAL_SIZE, ARITH_TRAIN_SIZE, make_arith_problems, make_chat_arith_problems
from async_rl.data.files import Messages, read_messages, read_rows
from async_rl.envs.calculator import CalculatorEnv, make_calculator_transcripts

__all__ = [
    "SFTExample",
    "TokenizedSFT",
    "load_sft_records",
    "render_conversation",
    "smoothing_token_ids",
    "tokenize_sft",
]


@dataclass(frozen=True)
class SFTExample:
    """One row as the learner takes it: prompt tokens, then the response tokens and their loss mask."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class TokenizedSFT:
    """Every kept row, and what truncation did."""

    examples: list[SFTExample] = field(default_factory=list)
    truncated: int = 0  # rows cut to max_length ('left' / 'right')
    chat: int = 0  # rows rendered through the chat template (the others are plain text)

    def __len__(self) -> int:
        return len(self.examples)


@dataclass(frozen=True)
class _Record:
    prompt: str | Messages  # plain text, or the whole conversation (chat and multi-turn)
    response: str | None  # plain text's response; None for a conversation
    where: str


def smoothing_token_ids(tokenizer: Any) -> list[int]:
    """The ids label smoothing spreads its mass over: every token of the tokenizer but its special ones (pad, bos,
    eos, unk, the chat markers). Spare embedding rows past ``len(tokenizer)`` are not tokens and get none."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def _parse(raw: Mapping[str, Any], where: str, d: SFTDataConfig) -> _Record:
    if d.multiturn.enable:
        key = d.multiturn.messages_key
        if key not in raw:
            raise ValueError(f"{where}: record has no field {key!r} (data.multiturn.messages_key)")
        messages = read_messages(raw[key], where, key)
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(f"{where}: field {key!r} has no assistant message to train on")
        if messages[0]["role"] == "assistant":
            raise ValueError(f"{where}: field {key!r} starts with an assistant message; a conversation needs a prompt")
        return _Record(messages, None, where)
    for key in (d.prompt_key, d.response_key):
        if key not in raw:
            raise ValueError(f"{where}: record has no field {key!r}")
    response = raw[d.response_key]
    if not isinstance(response, str) or not response:
        raise ValueError(f"{where}: field {d.response_key!r} must be a non-empty string")
    prompt = raw[d.prompt_key]
    if isinstance(prompt, str):
        return _Record(prompt, response, where)
    messages = read_messages(prompt, where, d.prompt_key)
    if messages[-1]["role"] == "assistant":
        raise ValueError(f"{where}: field {d.prompt_key!r} ends with an assistant message; the response is its reply")
    return _Record([*messages, {"role": "assistant", "content": response}], None, where)


CALCULATOR_TRAIN_SIZE = 2000  # solved conversations in builtin:calculator-sft's train split
CALCULATOR_EVAL_SIZE = 64  # and in its eval split (the RL recipe validates on 64 held-out problems)


def _calculator_env() -> CalculatorEnv:
    """The calculator environment with the RL config's tool options (``actor_rollout_ref.rollout.multi_turn``'s
    defaults), so its tool messages are those an episode gets."""
    mt = MultiTurnConfig()
    return CalculatorEnv(
        max_parallel_calls=mt.max_parallel_calls,
        max_tool_response_length=mt.max_tool_response_length,
        truncate_side=mt.tool_response_truncate_side,
        tool_format=mt.format,
    )


def load_sft_records(files: str | list[str], d: SFTDataConfig, *, split: str) -> list[_Record]:
    """Every record of ``files`` (``split`` picks the builtin sets' half), checked."""
    records: list[_Record] = []
    for f in [files] if isinstance(files, str) else files:
        if f in (BUILTIN_ARITH_SFT, BUILTIN_ARITH_SFT_CHAT):
            size = ARITH_TRAIN_SIZE if split == "train" else ARITH_EVAL_SIZE
            problems: list[dict[str, Any]] = (
                list(make_chat_arith_problems(size, split=split, seed=d.seed, digits=2))
                if f == BUILTIN_ARITH_SFT_CHAT
                else list(make_arith_problems(size, split=split, seed=d.seed, digits=2))
            )
            rows = [
                (f"{f} ({split}) row {i}", {d.prompt_key: p["prompt"], d.response_key: p["ground_truth"]})
                for i, p in enumerate(problems)
            ]
            if d.multiturn.enable:
                raise ValueError(f"{f} holds single exchanges: set data.multiturn.enable=false")
        elif f == BUILTIN_CALCULATOR_SFT:
            if not d.multiturn.enable:
                raise ValueError(f"{f} holds whole conversations: set data.multiturn.enable=true")
            size = CALCULATOR_TRAIN_SIZE if split == "train" else CALCULATOR_EVAL_SIZE
            conversations = make_calculator_transcripts(_calculator_env(), size, seed=d.seed, split=split)
            rows = [
                (f"{f} ({split}) row {i}", {d.multiturn.messages_key: c["messages"]})
                for i, c in enumerate(conversations)
            ]
        else:
            rows = read_rows(f)
        records.extend(_parse(raw, where, d) for where, raw in rows)
    if not records:
        raise ValueError(f"no SFT records in {files!r}")
    return records


def _model_turn_end(renderer: ChatRenderer, eos_token_id: int | None) -> list[int]:
    """The part of the template's assistant closer that the model samples: up to and including the EOS token (all of
    it when the closer holds no EOS: the model is then taught to write the whole closer)."""
    closer = renderer.closer_ids
    if eos_token_id is not None and eos_token_id in closer:
        return closer[: closer.index(eos_token_id) + 1]
    return list(closer)


def render_conversation(
    renderer: ChatRenderer, messages: Sequence[Mapping[str, str]], eos_token_id: int | None, *, where: str
) -> SFTExample:
    """A conversation as the actor's episode would hold it (see the module docstring)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = renderer.encode(renderer.render(messages[:first], add_generation_prompt=True))
    turn_end = _model_turn_end(renderer, eos_token_id)
    ids: list[int] = []
    mask: list[int] = []
    i = first
    while i < len(messages):
        sampled = renderer.encode(messages[i]["content"]) + turn_end
        ids += sampled
        mask += [1] * len(sampled)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j == i + 1 < len(messages):
            raise ValueError(f"{where}: messages {i} and {j} are both the assistant's; merge them into one turn")
        if j > i + 1:  # the messages after the turn, then the next turn's generation prompt (none at the end)
            gap = renderer.observation_ids(sampled, messages[i + 1 : j], add_generation_prompt=j < len(messages))
            ids += gap
            mask += [0] * len(gap)
        i = j
    return SFTExample(prompt, ids, mask)


def _plain(tokenizer: Any, prompt: str, response: str) -> SFTExample:
    encode = tokenizer(prompt, add_special_tokens=False)["input_ids"], tokenizer(response, add_special_tokens=False)
    response_ids = [int(t) for t in encode[1]["input_ids"]]
    if tokenizer.eos_token_id is not None:
        response_ids.append(int(tokenizer.eos_token_id))
    return SFTExample([int(t) for t in encode[0]], response_ids, [1] * len(response_ids))


def _truncate(ex: SFTExample, d: SFTDataConfig, where: str) -> tuple[SFTExample, bool]:
    total = len(ex.prompt_ids) + len(ex.response_ids)
    over = total - d.max_length
    if over <= 0:
        return ex, False
    if d.truncation == "error":
        raise ValueError(
            f"{where}: {total} tokens > data.max_length={d.max_length} (set data.truncation=left or right to cut it)"
        )
    if d.truncation == "left":
        if over >= len(ex.prompt_ids):
            raise ValueError(
                f"{where}: {total} tokens > data.max_length={d.max_length}, and cutting the prompt's start"
                " (data.truncation=left) would cut into the response"
            )
        return SFTExample(ex.prompt_ids[over:], ex.response_ids, ex.loss_mask), True
    keep = len(ex.response_ids) - over
    if keep <= 0:
        raise ValueError(f"{where}: the prompt alone is longer than data.max_length={d.max_length}")
    return SFTExample(ex.prompt_ids, ex.response_ids[:keep], ex.loss_mask[:keep]), True


def tokenize_sft(tokenizer: Any, records: Sequence[_Record], d: SFTDataConfig) -> TokenizedSFT:
    """Render, tokenize and truncate every record (see the module docstring)."""
    out = TokenizedSFT()
    renderer: ChatRenderer | None = None
    eos = None if tokenizer.eos_token_id is None else int(tokenizer.eos_token_id)
    for rec in records:
        if isinstance(rec.prompt, str):
            assert rec.response is not None
            ex = _plain(tokenizer, rec.prompt, rec.response)
        else:
            if renderer is None:
                if not getattr(tokenizer, "chat_template", None):
                    raise ValueError(
                        f"{rec.where}: chat messages need a chat template, and the tokenizer has none: set"
                        " model.custom_chat_template"
                    )
                renderer = ChatRenderer(tokenizer)
            ex = render_conversation(renderer, rec.prompt, eos, where=rec.where)
            out.chat += 1
        if not ex.prompt_ids:
            raise ValueError(f"{rec.where}: the prompt renders to no tokens")
        ex, cut = _truncate(ex, d, rec.where)
        if ex.trained_tokens == 0:
            raise ValueError(f"{rec.where}: no assistant token is left to train on (data.max_length={d.max_length})")
        out.truncated += cut
        out.examples.append(ex)
    return out
