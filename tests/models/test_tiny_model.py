"""The tiny in-code Qwen2 model and its char-level tokenizer (transformers side; vLLM loads it in the weight-sync
tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.models import DEFAULT_CHARSET, build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def test_vocabulary_layout(tokenizer) -> None:
    # 4 special tokens (<pad>, <eos>, <bos>, <unk>) take ids 0..3; the charset follows in order, so "0" (its first
    # character) is id 4 and "+" (the 11th) is id 14.
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert len(tokenizer) == 4 + len(DEFAULT_CHARSET)
    assert tokenizer("0+")["input_ids"] == [4, 14]


@settings(max_examples=50, deadline=None)
@given(text=st.text(alphabet=DEFAULT_CHARSET, max_size=40))
def test_round_trip_one_token_per_character(tokenizer, text: str) -> None:
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_saved_model_and_tokenizer_load_with_auto_classes(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = "what is 12+7?\n 19"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and len(ids) == len(text)  # spaces and newlines survive the reload
    assert tok.decode([1, *ids, 0], skip_special_tokens=True) == text
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = model.config
    # 54 tokens rounded up to a multiple of 16 -> 64; head_dim = 128 / 2 = 64 (vLLM's CPU attention needs 64).
    assert (cfg.vocab_size, cfg.hidden_size // cfg.num_attention_heads, cfg.num_key_value_heads) == (64, 64, 1)
    assert model.dtype == torch.float32
    # Parameters: embed 64*128 = 8192, lm_head 8192, final norm 128; per layer q 128*128+128 = 16512,
    # k and v 64*128+64 = 8256 each, o 16384, gate/up/down 3 * 256*128 = 98304, two norms 256 -> 147968;
    # total 8192 + 8192 + 128 + 2 * 147968 = 312448.
    assert sum(p.numel() for p in model.parameters()) == 312448
    logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 64) and torch.isfinite(logits).all()


def test_building_is_deterministic(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    a = load_file(build_tiny_model(tmp_path / "a", seed=3) / "model.safetensors")
    b = load_file(build_tiny_model(tmp_path / "b", seed=3) / "model.safetensors")
    c = load_file(build_tiny_model(tmp_path / "c", seed=4) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert torch.equal(a["model.norm.weight"], torch.ones(128))


def test_invalid_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="divisible by heads"):
        build_tiny_model(tmp_path, heads=3, seed=0)
    with pytest.raises(ValueError, match="kv_heads"):
        build_tiny_model(tmp_path, heads=2, kv_heads=3, seed=0)
    with pytest.raises(ValueError, match="duplicate"):
        build_char_tokenizer("abca")
    with pytest.raises(ValueError, match="ASCII"):
        build_char_tokenizer("abé")
    with pytest.raises(ValueError, match="layers"):
        build_tiny_model(tmp_path, layers=0, seed=0)
