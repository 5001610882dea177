"""A learned reward model's scores for token sequences (what the reward server and an inline actor both call).

The model is the reward-model trainer's export (``<run dir>/hf``): a transformers sequence-classification model with
one label, and ``reward_stats.json`` (the mean and standard deviation of its scores on held-out pairs). A sequence is
``prompt ids + response ids`` in the policy's tokenizer, which the reward model shares (checked at load: the
policy's vocabulary fits). A response is first finished as the trainer's sequences ended: its trailing EOS and
padding are dropped and the export's ``turn_end_ids`` appended (the chat template's end of turn, SmolLM2's
``<|im_end|>`` and newline; nothing for plain text), so the score is read at the same place as in training. An
export without that record (an older one, or a model from elsewhere) scores responses as sampled, with a warning.
The score is read at the last token that is not the pad token, as transformers' sequence classification reads it.
Longer sequences keep their last ``max_length`` tokens. Sequences are scored in batches of at most
``max_batch`` (right-padded), a group's prompt computed once (:meth:`RewardModelScorer.group_scores`), on CUDA when
there is a GPU, else on the CPU, in ``dtype`` (``auto``: bf16 where the device computes it faster than fp32,
:func:`async_rl.config.precision.auto_bf16`).

A score that is not finite raises :class:`UntrustedScore`: it is never replaced by a guess.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from async_rl.config.data_reward import RewardModelServeConfig

logger = logging.getLogger(__name__)

REWARD_STATS_FILE = "reward_stats.json"
TURN_END_KEY = "turn_end_ids"
"""The key of ``reward_stats.json`` that says how training sequences ended after a response (a list of token ids)."""


class UntrustedScore(ValueError):
    """The reward model produced a score that cannot be used (NaN, inf) or was asked something it cannot score."""


@dataclass(frozen=True)
class ScoreNormalization:
    """``(score - mean) / std`` with the export's held-out statistics; identity when off."""

    mean: float = 0.0
    std: float = 1.0

    def apply(self, raw: float) -> float:
        return (raw - self.mean) / self.std


def read_normalization(model_dir: str | Path, enabled: bool) -> ScoreNormalization:
    """The export's ``reward_stats.json`` as a normalisation (an error naming the file when it is missing or bad)."""
    if not enabled:
        return ScoreNormalization()
    path = Path(model_dir).expanduser() / REWARD_STATS_FILE
    try:
        stats = json.loads(path.read_text())
        mean, std = float(stats["mean"]), float(stats["std"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"reward.reward_model.normalize=true needs {path} with a finite 'mean' and 'std' ({exc});"
            " set reward.reward_model.normalize=false to use raw scores"
        ) from None
    if not (math.isfinite(mean) and math.isfinite(std)):
        raise ValueError(f"{path}: mean {mean} and std {std} must be finite")
    return ScoreNormalization(mean=mean, std=max(std, 1e-6))


class RewardModelScorer:
    """Scores token sequences with the reward model in ``model_dir``, ``max_batch`` sequences per forward pass."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_batch: int,
        max_length: int,
        normalize: bool,
        dtype: str,
        cpu_threads: int | None,
        vocab_size: int | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        from async_rl.config.precision import rollout_precision

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if cpu_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(cpu_threads)
        self.dtype, why = rollout_precision(dtype, self.device.type)
        self.model_dir = str(Path(model_dir).expanduser())
        self.max_batch = max_batch
        self.max_length = max_length
        self.normalization = read_normalization(self.model_dir, normalize)
        torch_dtype = torch.bfloat16 if self.dtype == "bfloat16" else torch.float32
        model: Any = AutoModelForSequenceClassification.from_pretrained(self.model_dir, dtype=torch_dtype)
        labels = int(model.config.num_labels)
        if labels != 1:
            raise ValueError(f"{self.model_dir}: a reward model has one label (a scalar score), this one has {labels}")
        pad = model.config.pad_token_id
        if pad is None:
            raise ValueError(f"{self.model_dir}: config.json has no pad_token_id (the trainer's export sets it)")
        self.vocab_size = int(model.config.vocab_size)
        if vocab_size is not None and vocab_size > self.vocab_size:
            raise ValueError(
                f"{self.model_dir}: the reward model's vocabulary ({self.vocab_size} tokens) is smaller than the"
                f" policy's ({vocab_size}): it must share the policy's tokenizer"
            )
        self.pad_token_id = int(pad)
        eos = model.config.eos_token_id
        self.end_tokens = {self.pad_token_id, *([] if eos is None else [eos] if isinstance(eos, int) else eos)}
        self.turn_end = read_turn_end(self.model_dir)
        if self.turn_end is None:
            logger.warning(
                "%s/%s records no %s: responses are scored as sampled, which may not be where the model was trained"
                " to read a score",
                self.model_dir,
                REWARD_STATS_FILE,
                TURN_END_KEY,
            )
        self.model = model.to(self.device).eval()
        logger.info(
            "reward model %s: %.1fM parameters, %s on %s (%s, %d torch threads), score normalised by mean %.4f"
            " std %.4f",
            self.model_dir,
            sum(p.numel() for p in model.parameters()) / 1e6,
            self.dtype,
            self.device.type,
            why,
            torch.get_num_threads(),
            self.normalization.mean,
            self.normalization.std,
        )

    def check(self, sequence: Sequence[int]) -> None:
        """Raise :class:`UntrustedScore` for a sequence the model cannot score (empty, ids outside its vocabulary)."""
        if not sequence:
            raise UntrustedScore("an empty sequence has no last token to score")
        low, high = min(sequence), max(sequence)
        if low < 0 or high >= self.vocab_size:
            raise UntrustedScore(f"token ids must be in [0, {self.vocab_size}), got {low}..{high}")

    def raw_scores(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        """The model's scores of ``sequences`` before normalisation (a batch of any size)."""
        import torch

        out: list[float] = []
        for start in range(0, len(sequences), self.max_batch):
            chunk = [list(s)[-self.max_length :] for s in sequences[start : start + self.max_batch]]
            for seq in chunk:
                self.check(seq)
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, seq in enumerate(chunk):
                ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[i, : len(seq)] = 1
            with torch.inference_mode():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            out.extend(float(v) for v in logits[:, 0].float().cpu())
        return out

    def scores(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        """Normalised scores of ``sequences``; :class:`UntrustedScore` when any is not finite."""
        return self._checked(self.raw_scores(sequences))

    def _checked(self, raw: Sequence[float]) -> list[float]:
        scores = [self.normalization.apply(v) for v in raw]
        bad = [i for i, v in enumerate(scores) if not math.isfinite(v)]
        if bad:
            raise UntrustedScore(f"the reward model returned non-finite scores for sequences {bad[:8]}")
        return scores

    def group_scores(self, prompt_ids: Sequence[int], response_ids: Sequence[Sequence[int]]) -> list[float]:
        """Normalised scores of ``prompt + response`` for each response: the prompt computed once (its keys and
        values cached, then shared by every response), the same scores as :meth:`scores` up to float rounding.
        Falls back to :meth:`scores` of the whole sequences when a sequence would be truncated, a response is empty,
        or the model has no separate trunk and ``score`` head."""
        kept = [self.finish(r) for r in response_ids]
        sequences = [list(prompt_ids) + r for r in kept]
        for seq in sequences:
            self.check(seq)
        trunk, head = getattr(self.model, "model", None), getattr(self.model, "score", None)
        if (
            trunk is None
            or head is None
            or not prompt_ids
            or min((len(r) for r in kept), default=0) < 1
            or len(prompt_ids) + max(len(r) for r in kept) > self.max_length
        ):
            return self.scores(sequences)
        return self._checked(self._prefix_scores(trunk, head, list(prompt_ids), kept))

    def score_groups(
        self, items: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]
    ) -> list[list[float] | UntrustedScore]:
        """Normalised scores of several groups ``(prompt ids, response ids)``, or each one's :class:`UntrustedScore`.
        Groups of one response (a validation round's greedy samples) are scored together as whole sequences, in
        batches of ``max_batch``; larger groups each with its prompt computed once (:meth:`group_scores`)."""
        results: list[list[float] | UntrustedScore] = [[] for _ in items]
        singles: list[int] = []
        sequences: list[list[int]] = []
        for i, (prompt_ids, response_ids) in enumerate(items):
            try:
                if len(response_ids) == 1:
                    sequence = list(prompt_ids) + self.finish(response_ids[0])
                    self.check(sequence)
                    singles.append(i)
                    sequences.append(sequence)
                else:
                    results[i] = self.group_scores(prompt_ids, response_ids)
            except UntrustedScore as exc:
                results[i] = exc
        if sequences:
            for i, raw in zip(singles, self.raw_scores(sequences), strict=True):
                try:
                    results[i] = self._checked([raw])
                except UntrustedScore as exc:
                    results[i] = exc
        return results

    def finish(self, response: Sequence[int]) -> list[int]:
        """``response`` as the trainer's sequences ended (see the module doc); without a ``turn_end_ids`` record,
        only its trailing padding is dropped (the score is read before it either way)."""
        tokens = list(response)
        if self.turn_end is None:
            return _strip_trailing(tokens, {self.pad_token_id})
        return _strip_trailing(tokens, self.end_tokens) + self.turn_end

    def _prefix_scores(self, trunk: Any, head: Any, prompt: list[int], responses: list[list[int]]) -> list[float]:
        import torch

        out: list[float] = []
        dev = self.device
        for start in range(0, len(responses), self.max_batch):
            chunk = responses[start : start + self.max_batch]
            n, width, plen = len(chunk), max(len(r) for r in chunk), len(prompt)
            with torch.inference_mode():
                cache = trunk(input_ids=torch.tensor([prompt], device=dev), use_cache=True).past_key_values
                cache.batch_repeat_interleave(n)
                ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
                mask = torch.zeros((n, plen + width), dtype=torch.long)
                mask[:, :plen] = 1
                for i, r in enumerate(chunk):
                    ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
                    mask[i, plen : plen + len(r)] = 1
                positions = torch.arange(plen, plen + width, device=dev)[None].expand(n, width)
                hidden = trunk(
                    input_ids=ids.to(dev),
                    attention_mask=mask.to(dev),
                    past_key_values=cache,
                    position_ids=positions,
                ).last_hidden_state
                last = torch.tensor([len(r) - 1 for r in chunk], device=dev)
                logits = head(hidden[torch.arange(n, device=dev), last])
            out.extend(float(v) for v in logits[:, 0].float().cpu())
        return out


def _strip_trailing(tokens: list[int], drop: set[int]) -> list[int]:
    end = len(tokens)
    while end and tokens[end - 1] in drop:
        end -= 1
    return tokens[:end]


def read_turn_end(model_dir: str | Path) -> list[int] | None:
    """The export's ``turn_end_ids`` (None when its ``reward_stats.json`` or the record is missing)."""
    try:
        value = json.loads((Path(model_dir).expanduser() / REWARD_STATS_FILE).read_text()).get(TURN_END_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, int) and t >= 0 for t in value):
        raise ValueError(f"{model_dir}/{REWARD_STATS_FILE}: {TURN_END_KEY} must be a list of token ids, got {value!r}")
    return value


def scorer_from_config(rm: RewardModelServeConfig) -> RewardModelScorer:
    """The scorer ``reward.reward_model`` (validated and resolved) describes."""
    assert rm.model_path is not None and rm.max_length is not None
    return RewardModelScorer(
        rm.model_path,
        max_batch=rm.max_batch_sequences,
        max_length=rm.max_length,
        normalize=rm.normalize,
        dtype=rm.dtype,
        cpu_threads=rm.cpu_threads,
    )


__all__ = [
    "REWARD_STATS_FILE",
    "TURN_END_KEY",
    "RewardModelScorer",
    "ScoreNormalization",
    "UntrustedScore",
    "read_normalization",
    "read_turn_end",
    "scorer_from_config",
]
