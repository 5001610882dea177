"""Multi-turn wiring from the config: environment arguments, builtin task data, prompt records and validation."""

from __future__ import annotations

import pytest

from async_rl.config import Config, ConfigError, load_config
from async_rl.runtime import resources
from async_rl.runtime.actor_main import environment_kwargs

MT = "actor_rollout_ref.rollout.multi_turn"


def _cfg(*overrides: str) -> Config:
    return load_config(None, list(overrides))


def test_tool_environment_gets_the_tool_options_then_the_users():
    cfg = _cfg(
        f"{MT}.enable=true",
        f"{MT}.environment=async_rl.envs.calculator:CalculatorEnv",
        f"{MT}.max_parallel_calls=3",
        f"{MT}.tool_response_truncate_side=left",
        f"{MT}.max_tool_response_length=99",
    )
    assert environment_kwargs(cfg) == {
        "max_parallel_calls": 3,
        "max_tool_response_length": 99,
        "truncate_side": "left",
        "tool_format": "hermes",
    }
    # An environment without tools gets only the user's arguments.
    cfg = _cfg(
        f"{MT}.enable=true",
        f"{MT}.environment=async_rl.envs.guessing:GuessingEnv",
        f"{MT}.environment_kwargs={{hi: 20}}",
    )
    assert environment_kwargs(cfg) == {"hi": 20}


def test_enable_needs_an_environment_spec():
    with pytest.raises(ConfigError, match=f"{MT}.environment"):
        _cfg(f"{MT}.enable=true")
    with pytest.raises(ConfigError, match="must look like"):
        _cfg(f"{MT}.enable=true", f"{MT}.environment=not a spec")


def test_builtin_multi_turn_tasks_load_and_keep_messages():
    from async_rl.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    cfg = _cfg(
        "data.train_files=builtin:guessing",
        "data.max_prompt_length=256",
        f"{MT}.enable=true",
        f"{MT}.environment=async_rl.envs.guessing:GuessingEnv",
    )
    records = resources.prompt_records(cfg, tok)
    assert len(records) == resources.ARITH_TRAIN_SIZE
    first = records[0].extras
    assert first["messages"][-1]["role"] == "user" and "higher or lower" in first["messages"][-1]["content"]
    assert 1 <= int(first["ground_truth"]) <= 20 and first["extra"]["data_source"] == "guessing"
    demo = resources.load_raw_records("builtin:guessing-demo", "prompt", "eval", 0)
    assert len(demo) == resources.ARITH_EVAL_SIZE and {int(r["ground_truth"]) for r in demo} == set(range(1, 21))
    assert demo[0]["prompt"][2] == {"role": "assistant", "content": "10"}  # the demonstration's first guess
    calc = resources.load_raw_records("builtin:calculator-tool", "prompt", "eval", 0)
    assert len(calc) == resources.ARITH_EVAL_SIZE and calc[0]["extra"]["data_source"] == "calculator_tool"
    # A string prompt cannot be a multi-turn episode: its observations go through the chat template.
    cfg = _cfg(f"{MT}.enable=true", f"{MT}.environment=async_rl.envs.guessing:GuessingEnv")
    with pytest.raises(ValueError, match="needs chat prompts"):
        resources.prompt_records(cfg, tok)


def test_custom_chat_template_is_applied():
    from async_rl.models.tiny import build_char_tokenizer

    cfg = _cfg("actor_rollout_ref.model.custom_chat_template={{ messages[0]['content'] }}")
    tok = resources.with_chat_template(cfg, build_char_tokenizer())
    assert tok.apply_chat_template([{"role": "user", "content": "abc"}], tokenize=False) == "abc"


def test_dry_run_builds_the_environment_and_names_a_bad_argument():
    from async_rl.runtime.dry_run import dry_run_report

    on = [
        "data.train_files=builtin:guessing",
        "data.max_prompt_length=256",
        f"{MT}.enable=true",
        f"{MT}.environment=async_rl.envs.guessing:GuessingEnv",
    ]
    with pytest.raises(ValueError, match="custom_chat_template"):  # the tiny model's tokenizer has no template
        dry_run_report(_cfg(*on))
    on.append("actor_rollout_ref.model.custom_chat_template={% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert dry_run_report(_cfg(*on))["reward"].startswith("the environment async_rl.envs.guessing:GuessingEnv")
    with pytest.raises(ValueError, match=f"{MT}.environment_kwargs: .*bogus"):
        dry_run_report(_cfg(*on, f"{MT}.environment_kwargs={{bogus: 1}}"))
