"""Token-exact multi-turn rendering: the ids and loss mask of a two-turn conversation, built by hand."""

from __future__ import annotations

import pytest

from async_rl.actor.chat_render import ChatRenderer, TemplateError

TINY_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<eos>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoTokenizer

    from async_rl.models.pretrained import ensure_pretrained

    return AutoTokenizer.from_pretrained(str(ensure_pretrained("smollm2-135m-instruct")))


@pytest.fixture(scope="module")
def tiny():
    from async_rl.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = TINY_TEMPLATE
    return tok


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_two_turn_chatml_ids_and_mask(smol):
    r = ChatRenderer(smol)
    im_start, im_end = smol.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    nl = _ids(smol, "\n")
    assert r.closer_text == "<|im_end|>\n" and r.closer_ids == [im_end, *nl]
    prompt = [{"role": "user", "content": "What is 12*13?"}]
    prompt_ids = smol.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    # Turn 1: the model calls the tool and ends its turn with <|im_end|>, as sampled.
    call = _ids(smol, '<tool_call>{"name": "calculator", "arguments": {"expression": "12*13"}}</tool_call>')
    turn1 = [*call, im_end]
    tool = [{"role": "tool", "content": "156"}]
    obs = r.observation_ids(turn1, tool)
    # Exactly: the closer's rest ("\n"), the tool message, the next generation prompt.
    expected_obs = [*nl, im_start, *_ids(smol, "tool\n156"), im_end, *nl, im_start, *_ids(smol, "assistant\n")]
    assert obs == expected_obs
    turn2 = [*_ids(smol, "The answer is 156."), im_end]
    response = turn1 + obs + turn2
    mask = [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    # The whole conversation, rendered at once, is the same token sequence followed by the final closer's "\n".
    whole = smol.apply_chat_template(
        [
            *prompt,
            {"role": "assistant", "content": smol.decode(call)},
            *tool,
            {"role": "assistant", "content": "The answer is 156."},
        ],
        tokenize=True,
        return_dict=False,
    )
    assert list(whole) == list(prompt_ids) + response + nl
    assert r.check(prompt, [(turn1, tool), (turn2, [])], list(prompt_ids) + response) == "ok"
    # The loss mask marks exactly the model's tokens: both turns' text and their <|im_end|>.
    sampled = [t for t, m in zip(response, mask, strict=True) if m]
    assert sampled == turn1 + turn2
    assert mask.count(0) == len(expected_obs)


def test_turn_cut_by_max_tokens_gets_the_whole_closer(smol):
    r = ChatRenderer(smol)
    im_end = smol.convert_tokens_to_ids("<|im_end|>")
    cut = _ids(smol, "<tool_call>{")  # no <|im_end|>: the turn hit max_tokens
    obs = r.observation_ids(cut, [{"role": "user", "content": "go on"}])
    assert obs[: len(r.closer_ids)] == [im_end, *_ids(smol, "\n")]


def test_template_check_counts_a_changed_token(smol):
    r = ChatRenderer(smol)
    im_end = smol.convert_tokens_to_ids("<|im_end|>")
    prompt = [{"role": "user", "content": "hi"}]
    prompt_ids = smol.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    turn = [*_ids(smol, "hello"), im_end]
    assert r.check(prompt, [(turn, [])], list(prompt_ids) + turn) == "ok"
    # The model sampled a tokenization that re-encoding its text does not give: same text, other tokens.
    drift = [*_ids(smol, "hel"), *_ids(smol, "lo"), im_end]
    assert drift != turn and smol.decode(drift) == smol.decode(turn)
    assert r.check(prompt, [(drift, [])], list(prompt_ids) + drift) == "retokenized"
    # Glue the template would not write (a missing newline after <|im_end|>) is a real mismatch.
    obs = [{"role": "user", "content": "again"}]
    glue = r.observation_ids(turn, obs)
    assert glue[0] == _ids(smol, "\n")[0]
    second = [*_ids(smol, "ok"), im_end]
    good = list(prompt_ids) + turn + glue + second
    assert r.check(prompt, [(turn, obs), (second, [])], good) == "ok"
    bad = list(prompt_ids) + turn + glue[1:] + second
    assert r.check(prompt, [(turn, obs), (second, [])], bad) == "mismatch"


def test_tiny_template_round_trip(tiny):
    r = ChatRenderer(tiny)
    eos = tiny.eos_token_id
    prompt = [{"role": "user", "content": "guess my number"}]
    prompt_ids = _ids(tiny, r.render(prompt, add_generation_prompt=True))
    turn1 = [*_ids(tiny, "5"), eos]
    obs_msgs = [{"role": "user", "content": "higher"}]
    obs = r.observation_ids(turn1, obs_msgs)
    assert tiny.decode(obs) == "\nuser: higher<eos>\nassistant: "
    turn2 = [*_ids(tiny, "8"), eos]
    assert r.check(prompt, [(turn1, obs_msgs), (turn2, [])], prompt_ids + turn1 + obs + turn2) == "ok"


def test_no_chat_template_names_the_key():
    from async_rl.models.tiny import build_char_tokenizer

    with pytest.raises(TemplateError, match="custom_chat_template"):
        ChatRenderer(build_char_tokenizer())


def test_special_tokens_inside_a_turn_are_content_not_a_mismatch(tiny):
    r = ChatRenderer(tiny)
    eos, pad = tiny.eos_token_id, tiny.pad_token_id
    prompt = [{"role": "user", "content": "guess"}]
    prompt_ids = _ids(tiny, r.render(prompt, add_generation_prompt=True))
    turn = [*_ids(tiny, "1"), pad, *_ids(tiny, "2"), eos]  # a sampled <pad> mid-turn (an untrained model does this)
    assert r.content_text(turn) == "1<pad>2"
    assert r.check(prompt, [(turn, [])], prompt_ids + turn) == "ok"
