"""Preference pairs: TRL's layout (strings, chat messages, margin), every bad row named, rendering and truncation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from async_rl.config.reward_model_train import RewardDataConfig
from async_rl.data.preferences import load_pairs, parse_pair, tokenize_pairs, turn_end_ids
from async_rl.data.toy_preferences import EVAL_PAIRS, make_toy_preferences
from async_rl.models.tiny import build_char_tokenizer

D = RewardDataConfig()
TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}: {{ m['content'] }}\n{% endfor %}"  # the tiny charset's


def _tokenizer(chat: bool = False):
    tok = build_char_tokenizer()
    if chat:
        tok.chat_template = TEMPLATE
    return tok


def test_plain_strings_with_and_without_margin() -> None:
    p = parse_pair({"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": 1.5}, "f:1", D)
    assert (p.prompt, p.chosen, p.rejected, p.margin, p.where) == ("1+1=", "2", "3", 1.5, "f:1")
    assert parse_pair({"prompt": "a", "chosen": "b", "rejected": "c"}, "f:2", D).margin == 0.0
    assert parse_pair({"prompt": "a", "chosen": "b", "rejected": "c", "margin": None}, "f:3", D).margin == 0.0
    implicit = parse_pair({"chosen": "ab", "rejected": "ac"}, "f:4", D)  # TRL's implicit prompt
    assert implicit.prompt == ""


def test_chat_messages_and_a_string_reply_to_a_chat_prompt() -> None:
    user = [{"role": "user", "content": "hi"}]
    p = parse_pair({"prompt": user, "chosen": [{"role": "assistant", "content": "yo"}], "rejected": "no"}, "f:1", D)
    assert p.prompt == user and p.chosen == [{"role": "assistant", "content": "yo"}] and p.rejected == "no"
    tok = _tokenizer(chat=True)
    out = tokenize_pairs(tok, [p], D, pad_token_id=tok.pad_token_id)
    # the whole conversation through the template
    assert tok.decode(out.chosen[0]) == "u: hi\na: yo\n" and tok.decode(out.rejected[0]) == "u: hi\na: no\n"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "a", "rejected": "c"}, "f:7: record has no field 'chosen'"),
        ({"prompt": "a", "chosen": "", "rejected": "c"}, "f:7: field 'chosen' is an empty string"),
        ({"prompt": 3, "chosen": "b", "rejected": "c"}, "f:7: field 'prompt' must be a string or a list of messages"),
        ({"prompt": "a", "chosen": "b", "rejected": 4}, "f:7: field 'rejected' must be a string or a list"),
        ({"prompt": "a", "chosen": [{"role": "assistant", "content": "b"}], "rejected": "c"}, "prompt is plain text"),
        ({"prompt": [{"role": "user"}], "chosen": "b", "rejected": "c"}, "field 'prompt' message 0 must be an object"),
        ({"prompt": [], "chosen": "b", "rejected": "c"}, "field 'prompt' is an empty message list"),
        (
            {
                "prompt": [{"role": "user", "content": "a"}],
                "chosen": [{"role": "user", "content": "b"}],
                "rejected": "c",
            },
            "field 'chosen' must end with an assistant message",
        ),
        ({"prompt": "a", "chosen": "b", "rejected": "c", "margin": "big"}, "field 'margin' must be a finite number"),
        ({"prompt": "a", "chosen": "b", "rejected": "c", "margin": float("nan")}, "field 'margin' must be a finite"),
        ({"prompt": "a", "chosen": "b", "rejected": "c", "margin": True}, "field 'margin' must be a finite number"),
    ],
)
def test_bad_rows_name_the_row_and_field(row: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_pair(row, "f:7", D)


def test_files_jsonl_and_parquet_and_custom_keys(tmp_path: Path) -> None:
    rows = [{"q": "1+1=", "good": "2", "bad": "3", "w": 0.5}, {"q": "2+2=", "good": "4", "bad": "5"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{**rows[0]}, {**rows[1], "w": None}]), tmp_path / "p.parquet")
    d = RewardDataConfig(prompt_key="q", chosen_key="good", rejected_key="bad", margin_key="w")
    pairs = load_pairs([str(tmp_path / "p.jsonl"), str(tmp_path / "p.parquet")], d, split="train")
    assert [(p.prompt, p.chosen, p.rejected, p.margin) for p in pairs] == [
        ("1+1=", "2", "3", 0.5),
        ("2+2=", "4", "5", 0.0),
    ] * 2
    assert pairs[1].where == f"{tmp_path / 'p.jsonl'}:2" and pairs[3].where == f"{tmp_path / 'p.parquet'} row 1"
    (tmp_path / "bad.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps({"q": "x", "good": "y"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: record has no field 'bad'"):
        load_pairs(str(tmp_path / "bad.jsonl"), d, split="train")
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"list\.jsonl:1: a record must be a JSON object"):
        load_pairs(str(tmp_path / "list.jsonl"), d, split="train")


def test_plain_rendering_truncation_and_the_pad_check() -> None:
    tok = _tokenizer()
    pair = parse_pair({"prompt": "12+34=", "chosen": "46", "rejected": "47"}, "f:1", D)
    out = tokenize_pairs(tok, [pair], D, pad_token_id=tok.pad_token_id)
    assert tok.decode(out.chosen[0]) == "12+34=46" and tok.decode(out.rejected[0]) == "12+34=47"
    left = tokenize_pairs(tok, [pair], RewardDataConfig(max_length=4), pad_token_id=tok.pad_token_id)
    assert tok.decode(left.chosen[0]) == "4=46" and left.truncated == 2 and left.dropped == 0  # the end is kept
    short = parse_pair({"prompt": "1=", "chosen": "1", "rejected": "2"}, "f:2", D)
    dropped = tokenize_pairs(tok, [pair, short], RewardDataConfig(max_length=4, truncation="drop"), pad_token_id=0)
    assert len(dropped) == 1 and dropped.dropped == 1 and tok.decode(dropped.chosen[0]) == "1=1"
    with pytest.raises(ValueError, match=r"f:1: field 'chosen' renders to 8 tokens > data.max_length=4"):
        tokenize_pairs(tok, [pair], RewardDataConfig(max_length=4, truncation="error"), pad_token_id=0)
    with pytest.raises(ValueError, match="f:1: field 'chosen' ends with the pad token"):
        tokenize_pairs(tok, [pair], D, pad_token_id=out.chosen[0][-1])
    chat = parse_pair({"prompt": [{"role": "user", "content": "a"}], "chosen": "b", "rejected": "c"}, "f:3", D)
    with pytest.raises(ValueError, match="f:3: chat messages need a chat template"):
        tokenize_pairs(tok, [chat], D, pad_token_id=0)


def test_toy_preferences_split_and_are_correct_over_wrong() -> None:
    train = make_toy_preferences(split="train", chat=False, seed=1)
    held_out = make_toy_preferences(split="eval", chat=False, seed=1)
    assert len(held_out) == EVAL_PAIRS and len(train) > 4 * EVAL_PAIRS
    key = lambda r: (r["prompt"], r["rejected"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in held_out}
    for r in train + held_out:
        a, b = r["prompt"].removesuffix("=").split("+")
        assert r["chosen"] == str(int(a) + int(b)) != r["rejected"]
    chat = make_toy_preferences(split="eval", chat=True, seed=1)
    assert chat[0]["prompt"][0]["role"] == "user" and chat[0]["chosen"][0]["role"] == "assistant"
    assert make_toy_preferences(split="train", chat=False, seed=2) != train  # the order follows the seed
    assert sorted(map(key, make_toy_preferences(split="train", chat=False, seed=2))) == sorted(map(key, train))


def test_the_turn_end_is_what_a_chat_rendering_adds_after_the_reply() -> None:
    tok = _tokenizer()
    assert turn_end_ids(tok) is None  # no template
    tok.chat_template = TEMPLATE  # no generation prompt: the prompt as sampled is not a prefix of the conversation
    assert turn_end_ids(tok) is None
    tok.chat_template = TEMPLATE + "{% if add_generation_prompt %}a: {% endif %}"
    assert turn_end_ids(tok) == tok("\n", add_special_tokens=False)["input_ids"]
    pair = parse_pair({"prompt": [{"role": "user", "content": "hi"}], "chosen": "yo", "rejected": "no"}, "f:1", D)
    plain = parse_pair({"prompt": "1+1=", "chosen": "2", "rejected": "3"}, "f:2", D)
    assert tokenize_pairs(tok, [pair, plain, pair], D, pad_token_id=tok.pad_token_id).chat == 2


def test_smollm2_prompt_as_sampled_plus_the_turn_end_is_the_trainers_sequence() -> None:
    from transformers import AutoTokenizer

    from async_rl.models.pretrained import ensure_pretrained

    tok = AutoTokenizer.from_pretrained(str(ensure_pretrained("smollm2-135m-instruct")))
    end = turn_end_ids(tok)
    assert end == tok.convert_tokens_to_ids(["<|im_end|>"]) + tok("\n", add_special_tokens=False)["input_ids"]
    user = [{"role": "user", "content": "What is 17 + 25?"}]
    pair = parse_pair({"prompt": user, "chosen": "17 + 25 = 42", "rejected": "41"}, "f:1", D)
    trained = tokenize_pairs(tok, [pair], D, pad_token_id=tok.pad_token_id).chosen[0]
    # what the actor holds: the prompt with its generation prompt, then the sampled reply
    prompt = tok(tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    reply = tok("17 + 25 = 42", add_special_tokens=False)["input_ids"]
    assert trained == prompt["input_ids"] + reply + end
