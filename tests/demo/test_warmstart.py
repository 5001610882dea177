"""The demo's warm start: greedy exact-match evaluation by hand, and the SFT entry point run on the demo's preset."""

from __future__ import annotations

from pathlib import Path

import torch

from async_rl.demo.warmstart import greedy_accuracy, prepare_warm_model
from async_rl.models.tiny import build_tiny_model


class _Scripted(torch.nn.Module):
    """A stand-in causal LM that writes a fixed reply to each prompt: ``replies[prompt ids]`` token by token (logits
    one-hot on the next scripted token), reading the unpadded tokens of each row as the greedy loop feeds them."""

    def __init__(self, replies: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        super().__init__()
        self.replies, self.vocab = replies, vocab

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> object:
        logits = torch.full((*input_ids.shape, self.vocab), -1e4)
        for row, (ids, attn) in enumerate(zip(input_ids.tolist(), attention_mask.tolist(), strict=True)):
            tokens = [t for t, a in zip(ids, attn, strict=True) if a]
            prompt = next(p for p in self.replies if tuple(tokens[: len(p)]) == p)
            reply = self.replies[prompt]
            logits[row, -1, reply[min(len(tokens) - len(prompt), len(reply) - 1)]] = 0.0
        return type("Out", (), {"logits": logits})()


def test_greedy_accuracy_scores_exact_matches_before_eos(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m", layers=1, hidden=32, heads=2, seed=0))

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    eos = tok.eos_token_id
    replies = {
        tuple(ids("1+3=")): [*ids("4"), eos],  # right
        tuple(ids("2+3=")): [*ids("6"), eos],  # wrong
        tuple(ids("9+1=")): [*ids("10"), eos],  # right, two tokens
        tuple(ids("5+5=")): ids("10"),  # never ends: "10" then "0"s up to max_new_tokens, wrong
    }
    problems = [
        {"prompt": "1+3=", "ground_truth": "4"},
        {"prompt": "2+3=", "ground_truth": "5"},
        {"prompt": "9+1=", "ground_truth": "10"},
        {"prompt": "5+5=", "ground_truth": "10"},
    ]
    model = _Scripted(replies, len(tok))
    assert greedy_accuracy((model, tok), problems) == 0.5
    assert greedy_accuracy((model, tok), problems, batch_size=3) == 0.5  # across batches of different widths
    assert greedy_accuracy((model, tok), problems[:1] + problems[2:3]) == 1.0


def test_prepare_warm_model_runs_the_sft_preset_and_measures(tmp_path: Path) -> None:
    # The shared demo/sweep recipe cut to 2 steps: the SFT entry point builds the tiny model, trains, exports a
    # loadable causal LM, and accuracy is measured before and after on the held-out problems.
    held_out = [{"prompt": "1+1=", "ground_truth": "2"}, {"prompt": "2+3=", "ground_truth": "5"}]
    model_dir, result = prepare_warm_model(tmp_path / "warm", steps=2, held_out=held_out)
    assert model_dir == tmp_path / "warm" / "hf"
    assert (model_dir / "config.json").is_file() and (model_dir / "tokenizer_config.json").is_file()
    assert result["warmstart/steps"] == 2 and result["warmstart/seconds"] > 0
    assert result["warmstart/loss"] > 0  # the smoothed loss of the last step, read back from the run's metrics
    assert result["heldout_greedy_accuracy_raw"] in (0.0, 0.5, 1.0)
    assert result["heldout_greedy_accuracy"] in (0.0, 0.5, 1.0)
    assert "step 2/2" in (tmp_path / "warm" / "sft.log").read_text()
