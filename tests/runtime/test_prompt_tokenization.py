"""Prompt tokenization in batches, each distinct prompt once: the same ids as one tokenizer call per prompt, on the
char-level tiny tokenizer and on SmolLM2's BPE with its ChatML template, and the records built from them."""

from __future__ import annotations

import pytest

from async_rl.config import load_config
from async_rl.runtime import resources

TINY_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<eos>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tiny():
    from async_rl.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = TINY_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoTokenizer

    from async_rl.models.pretrained import ensure_pretrained

    return AutoTokenizer.from_pretrained(str(ensure_pretrained("smollm2-135m-instruct")))


def _one_at_a_time(tok, prompt):
    if isinstance(prompt, list):
        return list(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False))
    return list(tok(prompt, add_special_tokens=False)["input_ids"])


def _prompts():
    chat = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in [(1, 2), (30, 4), (1, 2)]]
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess."}]
    return ["1+2=", chat[0], "12+7=", chat[1], system, "1+2=", chat[2], system, ""]


@pytest.mark.parametrize("which", ["tiny", "smol"])
def test_batched_ids_equal_one_call_per_prompt(which, request, monkeypatch):
    tok = request.getfixturevalue(which)
    prompts = _prompts()
    expected = [_one_at_a_time(tok, p) for p in prompts]
    assert expected[0] != expected[2] and expected[1] != expected[3] and expected[-1] == []
    monkeypatch.setattr(resources, "TOKENIZE_BATCH", 2)  # several batches of each kind
    got = resources.tokenize_prompts(tok, prompts)
    assert got == expected
    assert all(isinstance(t, int) for ids in got for t in ids)
    got[1].append(-1)  # a repeated prompt's ids are a list of its own
    assert got[6] == expected[6]


def test_each_distinct_prompt_is_encoded_once(tiny):
    calls: list[int] = []

    class Counting:
        chat_template = TINY_TEMPLATE

        def __call__(self, texts, add_special_tokens=False):
            calls.append(len(texts))
            return tiny(texts, add_special_tokens=add_special_tokens)

        def apply_chat_template(self, convs, **kw):
            calls.append(len(convs))
            return tiny.apply_chat_template(convs, **kw)

    prompts = _prompts() * 50
    assert resources.tokenize_prompts(Counting(), prompts) == [_one_at_a_time(tiny, p) for p in prompts]
    assert calls == [3, 3]  # 3 distinct chats (one with a system turn), then 3 distinct strings ("" included)


def test_chat_prompts_without_a_template_name_the_key(tiny):
    from async_rl.models.tiny import build_char_tokenizer

    with pytest.raises(ValueError, match="custom_chat_template"):
        resources.tokenize_prompts(build_char_tokenizer(), ["plain", [{"role": "user", "content": "hi"}]])
    assert resources.tokenize_prompts(build_char_tokenizer(), ["ab"]) == [_one_at_a_time(tiny, "ab")]


def test_guessing_records_decode_their_truncated_ids(tiny):
    """builtin:guessing: 20,000 games share one prompt; each record holds the ids, and the text they decode to."""
    cfg = load_config(
        None,
        [
            "data.train_files=builtin:guessing",
            "data.max_prompt_length=40",
            "data.truncation=left",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.environment=async_rl.envs.guessing:GuessingEnv",
        ],
    )
    records = resources.prompt_records(cfg, tiny)
    assert len(records) == resources.ARITH_TRAIN_SIZE
    raw = resources.load_raw_records("builtin:guessing", "prompt", "train", cfg.data.seed)
    full = _one_at_a_time(tiny, raw[0]["prompt"])
    assert len(full) > 40
    for i in (0, 1, 19_999):
        rec = records[i]
        assert rec.token_ids.tolist() == full[-40:]  # left truncation keeps the generation prompt
        assert rec.extras["prompt"] == tiny.decode(full[-40:]) and rec.extras["prompt"].endswith("assistant: ")
        assert rec.extras["ground_truth"] == raw[i]["ground_truth"]
