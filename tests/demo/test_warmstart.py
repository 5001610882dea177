"""Warm-start pieces of the embedded demo: schedule, smoothed loss, smoothing support, and a tiny end-to-end fit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from async_rl.demo.warmstart import character_token_ids, greedy_accuracy, sft_loss, warm_start, warmup_cosine
from async_rl.models.tiny import DEFAULT_CHARSET, build_char_tokenizer, build_tiny_model


def test_warmup_cosine_hand_values():
    # steps=10, warmup=2: warm-up (s+1)/2 -> 0.5, 1.0; then progress (s-2)/8 through a half cosine.
    f = [warmup_cosine(s, steps=10, warmup_steps=2) for s in (0, 1, 2, 6, 10, 12)]
    # s=2: progress 0 -> 1.0; s=6: progress 0.5 -> 0.5*(1+cos(pi/2)) = 0.5; s=10 and beyond: progress 1 -> 0.0
    assert f == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0, 0.0])
    # no warm-up: starts at the peak
    assert warmup_cosine(0, steps=4, warmup_steps=0) == pytest.approx(1.0)


def test_sft_loss_plain_and_smoothed_by_hand():
    # One position, vocab 3, logits [0, 0, ln 2] -> p = [1/4, 1/4, 1/2]; target is id 2.
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)]]])
    target = torch.tensor([[2]])
    mask = torch.ones(1, 1)
    assert sft_loss(logits, target, mask).item() == pytest.approx(math.log(2.0))  # -ln(1/2)
    # eps = 0.5 spread over ids {0, 1}: 0.5 * ln 2 + 0.5 * mean(ln 4, ln 4) = 1.5 ln 2
    smoothed = sft_loss(logits, target, mask, label_smoothing=0.5, smooth_ids=[0, 1])
    assert smoothed.item() == pytest.approx(1.5 * math.log(2.0))


def test_sft_loss_ignores_masked_positions():
    # Two positions: the first predicts its target with p = 1/2 (loss ln 2); the second is masked out and would
    # cost -ln(1e-9-ish) if it counted.
    logits = torch.tensor([[[0.0, math.log(2.0), 0.0], [30.0, -30.0, -30.0]]])
    target = torch.tensor([[1, 2]])
    mask = torch.tensor([[1.0, 0.0]])
    assert sft_loss(logits, target, mask).item() == pytest.approx(math.log(2.0))


@pytest.mark.parametrize(
    ("kwargs", "key"), [({"label_smoothing": 1.0}, "label_smoothing"), ({"label_smoothing": 0.1}, "smooth_ids")]
)
def test_sft_loss_bad_arguments(kwargs, key):
    with pytest.raises(ValueError, match=key):
        sft_loss(torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1), **kwargs)


def test_character_token_ids_skip_special_tokens():
    tok = build_char_tokenizer()
    ids = character_token_ids(tok)
    assert len(ids) == len(DEFAULT_CHARSET)  # one id per character, none for pad/eos/bos/unk
    assert not set(ids) & set(tok.all_special_ids)
    assert tok.convert_tokens_to_ids("7") in ids


def _tiny(tmp_path: Path) -> Path:
    return build_tiny_model(tmp_path / "m", layers=1, hidden=32, heads=2, kv_heads=1, seed=0)


def test_warm_start_fits_one_problem_and_smoothing_caps_confidence(tmp_path):
    problems = [{"prompt": "12+30=", "ground_truth": "42"}]
    plain = _tiny(tmp_path / "plain")
    assert greedy_accuracy(plain, problems) == 0.0  # random init does not know the answer
    warm_start(
        plain, problems, steps=60, batch_size=4, lr=1e-2, warmup_steps=5, label_smoothing=0.0, log_every=0, seed=0
    )
    assert greedy_accuracy(plain, problems) == 1.0

    smooth = _tiny(tmp_path / "smooth")
    warm_start(
        smooth, problems, steps=60, batch_size=4, lr=1e-2, warmup_steps=5, label_smoothing=0.3, log_every=0, seed=0
    )
    assert greedy_accuracy(smooth, problems) == 1.0  # smoothing keeps the argmax

    # Probability of the first answer token: ~1 without smoothing; the smoothed optimum is
    # 0.7 + 0.3 / 51 = 0.706 (51 characters share eps = 0.3), so it stays well below 0.9.
    def p_first(model_dir: Path) -> float:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        ids = torch.tensor([tok("12+30=", add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            probs = model(input_ids=ids).logits[0, -1].softmax(-1)
        return float(probs[tok.convert_tokens_to_ids("4")])

    assert p_first(plain) > 0.95
    assert 0.6 < p_first(smooth) < 0.85


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"steps": 0}, "steps"), ({"warmup_steps": -1}, "warmup_steps"), ({"label_smoothing": -0.1}, "label_smoothing")],
)
def test_warm_start_bad_arguments(tmp_path, kwargs, key):
    with pytest.raises(ValueError, match=key):
        warm_start(tmp_path, [{"prompt": "1+1=", "ground_truth": "2"}], lr=1e-3, seed=0, **kwargs)


def test_prepare_warm_model_builds_trains_and_measures(tmp_path):
    # The shared demo/sweep recipe on the full-size tiny model, cut to 1 step: it writes a loadable checkpoint and
    # reports accuracy before and after on the held-out problems.
    from async_rl.demo.warmstart import prepare_warm_model

    held_out = [{"prompt": "1+1=", "ground_truth": "2"}, {"prompt": "2+3=", "ground_truth": "5"}]
    result = prepare_warm_model(tmp_path / "warm", steps=1, held_out=held_out, log_every=0)
    assert result["warmstart/steps"] == 1
    assert 0.0 <= result["heldout_greedy_accuracy_raw"] <= 1.0 and 0.0 <= result["heldout_greedy_accuracy"] <= 1.0
    assert (tmp_path / "warm" / "config.json").is_file() and (tmp_path / "warm" / "model.safetensors").is_file()
