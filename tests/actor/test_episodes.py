"""The episode runner on a scripted engine and environment: token layout, mask, turns, limits and finish reasons.

The engine and environment are fakes (this is the unit test of the runner); the renderer is the real one on the tiny
model's tokenizer. The e2e test (tests/e2e/test_multi_turn_e2e.py) runs the real vLLM, environment worker and learner.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
import pytest

from async_rl.actor.chat_render import ChatRenderer
from async_rl.actor.engine import EngineOutput
from async_rl.actor.episodes import EpisodeRunner
from async_rl.config.actor_rollout_ref import MultiTurnConfig
from async_rl.transport.protocol import GroupSampling, PromptGrant, pack_array, unpack_array
from async_rl.transport.validation import check_group
from tests.actor.test_chat_render import TINY_TEMPLATE


@pytest.fixture(scope="module")
def tok():
    from async_rl.models.tiny import build_char_tokenizer

    t = build_char_tokenizer()
    t.chat_template = TINY_TEMPLATE
    return t


@dataclass
class Step:
    observations: list
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class ScriptedEngine:
    """Answers each call with the next text of a script (one script per episode seed offset)."""

    def __init__(self, tok, texts, *, eos=True, version=3):
        self.tok, self.texts, self.eos, self.version = tok, list(texts), eos, version
        self.prompts: list[list[int]] = []
        self.max_tokens: list[int] = []

    async def generate(self, prompt_token_ids, sampling):
        assert sampling.n == 1
        self.prompts.append(list(prompt_token_ids))
        self.max_tokens.append(sampling.max_tokens)
        ids = self.tok(self.texts.pop(0), add_special_tokens=False)["input_ids"]
        if self.eos:
            ids = [*ids, self.tok.eos_token_id]
        reason = "stop"
        if len(ids) > sampling.max_tokens:
            ids, reason = ids[: sampling.max_tokens], "length"
        text = self.tok.decode(ids, skip_special_tokens=True)
        lps = np.full(len(ids), -0.5, dtype=np.float32)
        return [EngineOutput(np.asarray(ids, np.int32), lps, reason, self.version, self.version, text)]


class GuessEnv:
    """A two-step scripted environment: 'higher' once, then done with reward 1."""

    def __init__(self):
        self.steps: dict[str, int] = {}
        self.closed: list[str] = []
        self.finals: list[str] = []

    def reset(self, episode_id, prompt, ground_truth, extra):
        self.steps[episode_id] = 0

    def step(self, episode_id, text):
        self.steps[episode_id] += 1
        if text.strip() == "8":
            return Step([], 1.0, True, {"tool_calls": 1})
        return Step([{"role": "user", "content": "higher"}], 0.0, False, {"tool_calls": 1, "tool_errors": 0})

    def final_reward(self, episode_id, text):
        self.finals.append(text)
        return 0.25

    def close(self, episode_id):
        self.closed.append(episode_id)

    def shutdown(self):
        pass

    def metrics(self):
        return {"calls": float(sum(self.steps.values()))}


def _multi_turn(max_assistant_turns, max_user_turns, sanity_check):
    """The config section the runner reads (``actor_rollout_ref.rollout.multi_turn``), with these three keys set."""
    return MultiTurnConfig(
        max_assistant_turns=max_assistant_turns,
        max_user_turns=max_user_turns,
        tokenization_sanity_check_mode=sanity_check,
    )


def _grant(tok, max_tokens=64, n=1):
    messages = [{"role": "user", "content": "guess my number"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    sampling = GroupSampling(n=n, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, seed=None)
    extras = {"prompt": "guess my number", "ground_truth": "8", "extra": {}, "messages": messages}
    return PromptGrant(7, 1, 0, pack_array(list(ids), "<i4"), sampling, extras), list(ids)


def _run(runner, grant, prompt_ids):
    return asyncio.run(runner.run_group(grant, prompt_ids))


def test_two_turn_episode_layout(tok):
    env = GuessEnv()
    engine = ScriptedEngine(tok, ["5", "8"])
    runner = EpisodeRunner(engine, ChatRenderer(tok), env, _multi_turn(None, None, "strict"))
    grant, prompt_ids = _grant(tok)
    (c,) = _run(runner, grant, prompt_ids)
    tokens, mask, lps = unpack_array(c.token_ids), unpack_array(c.loss_mask), unpack_array(c.logprobs)
    eos = tok.eos_token_id
    turn1 = [*tok("5", add_special_tokens=False)["input_ids"], eos]
    obs = tok("\nuser: higher<eos>\nassistant: ", add_special_tokens=False)["input_ids"]
    turn2 = [*tok("8", add_special_tokens=False)["input_ids"], eos]
    assert tokens.tolist() == turn1 + obs + turn2
    assert mask.tolist() == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    assert lps.tolist() == [-0.5] * len(turn1) + [0.0] * len(obs) + [-0.5] * len(turn2)
    assert [(t.start, t.length, t.finish_reason) for t in c.turns] == [
        (0, len(turn1), "stop"),
        (len(turn1) + len(obs), len(turn2), "stop"),
    ]
    assert (c.reward, c.finish_reason, c.version_min, c.version_max) == (1.0, "stop", 3, 3)
    assert [t.reward for t in c.turns] == [0.0, 1.0]
    assert c.episode.tool_calls == 2 and not c.episode.template_mismatch and not c.episode.retokenization_drift
    # The second turn was generated from the prompt plus everything so far (the prefix cache's input).
    assert engine.prompts[1] == prompt_ids + turn1 + obs
    assert engine.max_tokens == [64, 64 - len(turn1) - len(obs)]
    assert len(env.closed) == 1 and runner.template_mismatches == 0
    # The group passes the learner's validation of untrusted actor input.
    from async_rl.transport.protocol import RolloutGroup

    group = RolloutGroup(prompt_id=7, lease_id=1, actor_id="a", completions=[c])
    assert (
        check_group(
            group, grant.sampling, policy_version=3, vocab_size=len(tok), max_response_length=grant.sampling.max_tokens
        )
        is None
    )


def test_turn_limit_and_length(tok):
    env = GuessEnv()
    runner = EpisodeRunner(ScriptedEngine(tok, ["1", "2", "3"]), ChatRenderer(tok), env, _multi_turn(2, None, "strict"))
    grant, prompt_ids = _grant(tok)
    (c,) = _run(runner, grant, prompt_ids)
    # Ended by the driver: the environment's final_reward scores the last turn.
    assert (len(c.turns), c.finish_reason, c.reward, env.finals) == (2, "turn_limit", 0.25, ["2"])
    assert unpack_array(c.loss_mask)[-1] == 1  # ends on a sampled token
    # Observations that leave no room for another model token end the episode, on the last sampled token.
    runner = EpisodeRunner(
        ScriptedEngine(tok, ["1", "2"]), ChatRenderer(tok), GuessEnv(), _multi_turn(None, None, "strict")
    )
    grant, prompt_ids = _grant(tok, max_tokens=12)
    (c,) = _run(runner, grant, prompt_ids)
    assert (len(c.turns), c.finish_reason) == (1, "length")
    assert unpack_array(c.loss_mask).tolist() == [1, 1]
    # A turn cut by the budget ends the episode as truncated.
    runner = EpisodeRunner(
        ScriptedEngine(tok, ["123456"]), ChatRenderer(tok), GuessEnv(), _multi_turn(None, None, "strict")
    )
    grant, prompt_ids = _grant(tok, max_tokens=4)
    (c,) = _run(runner, grant, prompt_ids)
    assert (c.finish_reason, len(unpack_array(c.token_ids))) == ("length", 4)


def test_max_user_turns(tok):
    runner = EpisodeRunner(
        ScriptedEngine(tok, ["1", "2", "3"]), ChatRenderer(tok), GuessEnv(), _multi_turn(None, 1, "strict")
    )
    grant, prompt_ids = _grant(tok)
    (c,) = _run(runner, grant, prompt_ids)
    assert (len(c.turns), c.finish_reason) == (2, "turn_limit")
    assert unpack_array(c.loss_mask).tolist().count(0) > 0


class SolvedEnv(GuessEnv):
    """GuessEnv whose steps report ``info["solved"]`` as the guessing game does."""

    def step(self, episode_id, text):
        result = super().step(episode_id, text)
        result.info["solved"] = float(result.done)
        return result


def test_the_solved_component_is_the_last_steps_flag(tok):
    grant, prompt_ids = _grant(tok)
    won = EpisodeRunner(
        ScriptedEngine(tok, ["5", "8"]), ChatRenderer(tok), SolvedEnv(), _multi_turn(None, None, "strict")
    )
    (c,) = _run(won, grant, prompt_ids)
    assert (c.reward, c.reward_components) == (1.0, {"solved": 1.0})
    # Ended by the turn limit: the last step said 0, whatever final_reward gives.
    lost = EpisodeRunner(
        ScriptedEngine(tok, ["1", "2"]), ChatRenderer(tok), SolvedEnv(), _multi_turn(2, None, "strict")
    )
    (c,) = _run(lost, grant, prompt_ids)
    assert (c.finish_reason, c.reward, c.reward_components) == ("turn_limit", 0.25, {"solved": 0.0})
    # An environment that never reports it: no component.
    plain = EpisodeRunner(
        ScriptedEngine(tok, ["5", "8"]), ChatRenderer(tok), GuessEnv(), _multi_turn(None, None, "strict")
    )
    (c,) = _run(plain, grant, prompt_ids)
    assert c.reward_components is None


def test_group_of_episodes_runs_concurrently_and_closes_every_episode(tok):
    env = GuessEnv()
    runner = EpisodeRunner(ScriptedEngine(tok, ["8"] * 4), ChatRenderer(tok), env, _multi_turn(None, None, "disable"))
    grant, prompt_ids = _grant(tok, n=4)
    out = _run(runner, grant, prompt_ids)
    assert [c.reward for c in out] == [1.0] * 4
    assert len(set(env.closed)) == 4
    assert runner.metrics()["actor/episodes"] == 4.0
