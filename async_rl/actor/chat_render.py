"""Token-exact multi-turn rendering: the model's tokens are kept as sampled, only new messages go through the template.

An episode is one growing token sequence. After each model turn the actor appends the tokens that the chat template
puts between that turn and the model's next one: the rest of the assistant turn's closer (``<|im_end|>\\n`` in
ChatML, of which the model usually sampled ``<|im_end|>`` itself), then the observation messages, then the generation
prompt (``<|im_start|>assistant\\n``). Nothing the model sampled is ever decoded and encoded again, so the learner
trains on exactly the tokens whose behaviour log-probs vLLM reported.

The delta of a set of new messages is found by rendering them after a fixed two-message conversation (a user turn and
an assistant turn whose contents are sentinels) and cutting off that conversation's own rendering. That is the
"render only the new messages" rule; it is exact for templates that render each message independently of the ones
after it (ChatML, Llama 3, Qwen2.5 and SmolLM2 do).

:meth:`ChatRenderer.check` is the template check: it renders the whole conversation at once (the assistant turns as
the text of their tokens) and compares it with the episode's tokens. Templates that rewrite earlier turns (some drop
reasoning from past assistant turns) fail it with other text, and the actor counts every such mismatch
(``rollout/template_mismatches``). Same text with other tokens is counted apart (``rollout/retokenization_drift``):
the model sampled a tokenization that re-encoding its text does not reproduce, which is harmless here, since nothing
is re-encoded, and exactly what a re-tokenizing rollout would get wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ChatRenderer", "TemplateError"]

_USER = "\u2063user\u2063"
_ASSISTANT = "\u2063assistant\u2063"


class TemplateError(ValueError):
    """The chat template cannot be used for token-exact multi-turn rendering."""


class ChatRenderer:
    """Renders observation deltas for one tokenizer's chat template (HF tokenizer API)."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the tokenizer has no chat template, which multi-turn rendering needs; "
                "set actor_rollout_ref.model.custom_chat_template"
            )
        self.tokenizer = tokenizer
        self._base = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        self._base_text = self.render(self._base, add_generation_prompt=False)
        cut = self._base_text.rfind(_ASSISTANT)
        if cut < 0:
            raise TemplateError("the chat template does not render an assistant message's content")
        self.closer_text = self._base_text[cut + len(_ASSISTANT) :]
        self.closer_ids = self.encode(self.closer_text)

    # ------------------------------------------------------------------ tokenizer helpers
    def render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [int(t) for t in ids]

    def content_text(self, sampled: Sequence[int]) -> str:
        """The exact text of a model turn as the template's assistant content: every token (special ones too, as
        their text) except the closer tokens it ended with."""
        end = len(sampled) - (len(self.closer_ids) - len(self.closer_rest(sampled)))
        return str(self.tokenizer.decode(list(sampled[:end]), skip_special_tokens=False))

    # ------------------------------------------------------------------ the delta
    def closer_rest(self, sampled: Sequence[int]) -> list[int]:
        """What is left of the assistant closer after a turn that ended with ``sampled``: the closer minus its longest
        prefix that the turn already ends with (the model sampled ``<|im_end|>``; a turn cut by max_tokens gets the
        whole closer)."""
        closer = self.closer_ids
        for k in range(min(len(closer), len(sampled)), 0, -1):
            if list(sampled[-k:]) == closer[:k]:
                return closer[k:]
        return list(closer)

    def observation_ids(
        self, sampled: Sequence[int], messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Tokens to append after a model turn ending with ``sampled``: the closer's rest, ``messages`` and the
        generation prompt of the next model turn (without it: a conversation that ends with ``messages``)."""
        if not messages:
            raise ValueError("observation_ids needs at least one message")
        full = self.render([*self._base, *messages], add_generation_prompt=add_generation_prompt)
        if not full.startswith(self._base_text):
            raise TemplateError("the chat template renders earlier messages differently when more follow")
        return self.closer_rest(sampled) + self.encode(full[len(self._base_text) :])

    # ------------------------------------------------------------------ the template check
    def check(
        self,
        prompt_messages: Sequence[Mapping[str, str]],
        turns: Sequence[tuple[Sequence[int], Sequence[Mapping[str, str]]]],
        token_ids: Sequence[int],
        *,
        ignore_strippable: bool = False,
    ) -> str:
        """Render the whole conversation at once (``turns``: each model turn's sampled tokens and the messages after
        it) and compare it with ``token_ids`` (prompt + response), which it must give as a prefix followed by at
        most the final turn's closer. Returns

        * ``"ok"``: the same tokens;
        * ``"retokenized"``: the same text, other tokens: re-encoding the model's text would not give back what it
          sampled (this runner never re-encodes, so nothing is wrong; a system that re-tokenizes would train on
          tokens the policy did not sample);
        * ``"mismatch"``: other text: the template renders the conversation differently from turn by turn."""
        conversation = [dict(m) for m in prompt_messages]
        for sampled, observations in turns:
            conversation.append({"role": "assistant", "content": self.content_text(sampled)})
            conversation.extend(dict(m) for m in observations)
        text = self.render(conversation, add_generation_prompt=False)
        expected = self.encode(text)
        ours = list(token_ids)
        if ignore_strippable:
            expected, ours = self._strip(expected), self._strip(ours)
        if expected[: len(ours)] == ours and len(expected) - len(ours) <= len(self.closer_ids):
            return "ok"
        ours_text = str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))
        if text.startswith(ours_text) and len(text) - len(ours_text) <= len(self.closer_text):
            return "retokenized"
        return "mismatch"

    def _strip(self, ids: list[int]) -> list[int]:
        return [t for t in ids if self.tokenizer.decode([t]).strip()]
