"""SFT records: plain text, chat and multi-turn conversations with tool turns, rendered as the actor renders them, the
loss mask on the assistant's tokens only (checked by hand on SmolLM2's ChatML template), truncation and bad rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from async_rl.actor.chat_render import ChatRenderer
from async_rl.config.sft import SFTDataConfig
from async_rl.data.sft import load_sft_records, tokenize_sft
from async_rl.envs.calculator import DEMONSTRATION
from async_rl.runtime.resources import tokenize_prompts

D = SFTDataConfig()
MULTI = msgspec.structs.replace(D, multiturn=msgspec.structs.replace(D.multiturn, enable=True))


@pytest.fixture(scope="module")
def smollm2() -> Any:
    from transformers import AutoTokenizer

    from async_rl.models.pretrained import ensure_pretrained

    return AutoTokenizer.from_pretrained(str(ensure_pretrained("smollm2-135m-instruct")))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from async_rl.models import build_tiny_model

    return AutoTokenizer.from_pretrained(str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)))


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_plain_text_trains_the_response_and_the_eos(tiny: Any, tmp_path: Path) -> None:
    f = _write(tmp_path / "d.jsonl", [{"prompt": "12+3=", "response": "15"}])
    out = tokenize_sft(tiny, load_sft_records(f, D, split="train"), D)
    (ex,) = out.examples
    assert ex.prompt_ids == tiny("12+3=", add_special_tokens=False)["input_ids"]
    assert ex.response_ids == [*tiny("15", add_special_tokens=False)["input_ids"], tiny.eos_token_id]
    assert ex.loss_mask == [1, 1, 1] and out.chat == 0 and out.truncated == 0


def test_a_tool_conversation_masks_everything_but_the_assistant_turns(smollm2: Any, tmp_path: Path) -> None:
    """By hand, on ChatML: the prompt ends with ``<|im_start|>assistant\\n``; a turn is its content and ``<|im_end|>``
    (what the model samples); then ``\\n``, the tool message and the next generation prompt (written by the
    environment and the template: not trained); the last turn ends at its ``<|im_end|>``."""
    tok = smollm2
    system = {"role": "system", "content": "Use the calculator."}
    convo = [system, *DEMONSTRATION]  # user, assistant (a tool call), tool (its result), assistant (the answer)
    f = _write(tmp_path / "d.jsonl", [{"messages": convo}])
    out = tokenize_sft(tok, load_sft_records(f, MULTI, split="train"), MULTI)
    (ex,) = out.examples

    def enc(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end == tok.eos_token_id
    prompt = enc(
        f"<|im_start|>system\n{system['content']}<|im_end|>\n<|im_start|>user\n{convo[1]['content']}<|im_end|>\n"
    )
    assert ex.prompt_ids == prompt + enc("<|im_start|>assistant\n")
    call, answer = enc(convo[2]["content"]) + [im_end], enc(convo[4]["content"]) + [im_end]
    gap = enc(f"\n<|im_start|>tool\n{convo[3]['content']}<|im_end|>\n<|im_start|>assistant\n")
    assert ex.response_ids == call + gap + answer
    assert ex.loss_mask == [1] * len(call) + [0] * len(gap) + [1] * len(answer)
    assert out.chat == 1
    # the actor's own pieces give the same row: its prompt tokenization, and the template rendered all at once
    assert tokenize_prompts(tok, [convo[:2]])[0] == ex.prompt_ids
    turns = [(call, [convo[3]]), (answer, [])]
    assert ChatRenderer(tok).check(convo[:2], turns, ex.prompt_ids + ex.response_ids) == "ok"


def test_a_chat_prompt_with_a_string_response_is_one_exchange(smollm2: Any, tmp_path: Path) -> None:
    user = [{"role": "user", "content": "What is 17 + 25?"}]
    f = _write(tmp_path / "d.jsonl", [{"prompt": user, "response": "42"}])
    (ex,) = tokenize_sft(smollm2, load_sft_records(f, D, split="train"), D).examples
    assert ex.prompt_ids == tokenize_prompts(smollm2, [user])[0]
    assert ex.response_ids == [*smollm2("42", add_special_tokens=False)["input_ids"], smollm2.eos_token_id]
    assert ex.loss_mask == [1] * len(ex.response_ids)


def test_truncation_cuts_the_side_it_names_or_stops_naming_the_row(tiny: Any, tmp_path: Path) -> None:
    f = _write(tmp_path / "d.jsonl", [{"prompt": "123+456=", "response": "579"}])  # 8 + 4 tokens (chars + eos)
    records = load_sft_records(f, D, split="train")
    short = {"max_length": 10}
    with pytest.raises(ValueError, match=r"d\.jsonl:1: 12 tokens > data\.max_length=10"):
        tokenize_sft(tiny, records, msgspec.structs.replace(D, **short))
    left = tokenize_sft(tiny, records, msgspec.structs.replace(D, truncation="left", **short))
    (ex,) = left.examples
    assert left.truncated == 1 and len(ex.prompt_ids) == 6 and ex.response_ids[-1] == tiny.eos_token_id
    right = tokenize_sft(tiny, records, msgspec.structs.replace(D, truncation="right", **short))
    (ex,) = right.examples
    assert len(ex.prompt_ids) == 8 and ex.loss_mask == [1, 1] and ex.response_ids[-1] != tiny.eos_token_id
    with pytest.raises(ValueError, match="the prompt alone is longer than data.max_length=8"):
        tokenize_sft(tiny, records, msgspec.structs.replace(D, truncation="right", max_length=8))


@pytest.mark.parametrize(
    ("row", "config", "message"),
    [
        ({"prompt": "1+1="}, D, r"d\.jsonl:1: record has no field 'response'"),
        ({"prompt": "1+1=", "response": ""}, D, "field 'response' must be a non-empty string"),
        ({"prompt": [{"role": "user"}], "response": "2"}, D, "message 0 must be an object with string 'role'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, MULTI, "has no assistant message to train on"),
        (
            {"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "hi"}]},
            MULTI,
            "starts with an assistant message",
        ),
        ({"prompt": "1+1=", "response": "2"}, MULTI, "record has no field 'messages'"),
    ],
)
def test_a_bad_row_is_an_error_naming_its_file_row_and_field(
    tmp_path: Path, row: dict[str, Any], config: SFTDataConfig, message: str
) -> None:
    f = _write(tmp_path / "d.jsonl", [row])
    with pytest.raises(ValueError, match=message):
        load_sft_records(f, config, split="train")


def test_two_assistant_turns_in_a_row_are_refused(smollm2: Any, tmp_path: Path) -> None:
    convo = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]
    f = _write(tmp_path / "d.jsonl", [{"messages": convo}])
    with pytest.raises(ValueError, match=r"d\.jsonl:1: messages 1 and 2 are both the assistant's"):
        tokenize_sft(smollm2, load_sft_records(f, MULTI, split="train"), MULTI)


def test_the_builtin_sets_are_the_arithmetic_task_split_like_rl(tiny: Any) -> None:
    train = load_sft_records("builtin:arith-sft", D, split="train")
    held_out = load_sft_records("builtin:arith-sft", D, split="eval")
    assert (len(train), len(held_out)) == (20000, 200)
    assert not {r.prompt for r in held_out} & {r.prompt for r in train[:2000]}  # the RL task's hash split
    first = held_out[0]
    assert isinstance(first.prompt, str) and first.prompt.endswith("=") and first.response is not None
    a, b = first.prompt[:-1].split("+")
    assert int(first.response) == int(a) + int(b)
    chat = load_sft_records("builtin:arith-sft-chat", D, split="eval")
    assert isinstance(chat[0].prompt, list) and chat[0].prompt[-1] == {"role": "assistant", "content": first.response}
