"""PromptTailScheduler on the real vLLM CPU build: a group's samples copy the prompt's partial last block from the
first sample instead of prefilling it, and generate exactly what vLLM's own scheduler makes them generate."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")

from async_rl.actor.engine import PROMPT_TAIL_SCHEDULER  # noqa: E402
from async_rl.actor.prompt_tails import PromptTailScheduler  # noqa: E402
from async_rl.models.tiny import build_tiny_model  # noqa: E402

VLLM_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
BLOCK = 32
N = 4
# prompt lengths: a tail of 8 after one full block, a prompt inside its first block, a tail of one token (which the
# request computes anyway), and two full blocks (no tail)
LENGTHS = (40, 20, 33, 64)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)


def _engine(model_dir: Path, scheduler_cls: str) -> Any:
    return vllm.LLM(
        model=str(model_dir),
        enforce_eager=True,
        dtype="float32",
        max_model_len=128,
        block_size=BLOCK,
        enable_prefix_caching=True,
        enable_chunked_prefill=False,
        logprobs_mode="processed_logprobs",
        seed=0,
        scheduler_cls=scheduler_cls,
    )


@pytest.fixture(scope="module")
def outputs(model_dir: Path) -> Iterator[dict[str, list[Any]]]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    prompts = [
        {"prompt_token_ids": [(7 * i + 3 * j) % 60 + 2 for j in range(length)]} for i, length in enumerate(LENGTHS)
    ]
    params = vllm.SamplingParams(n=N, temperature=1.0, max_tokens=12, ignore_eos=True, logprobs=0, seed=11)
    out: dict[str, list[Any]] = {}
    for name in (PROMPT_TAIL_SCHEDULER, VLLM_SCHEDULER):
        llm = _engine(model_dir, name)
        # twice: the second round runs while the prefix cache holds the first round's full blocks
        out[name] = [llm.generate(prompts, params, use_tqdm=False) for _ in range(2)]
        llm.llm_engine.engine_core.shutdown()
        del llm
    yield out


def _samples(rounds: list[Any]) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    return [
        (tuple(s.token_ids), tuple(next(iter(lp.values())).logprob for lp in s.logprobs))
        for batch in rounds
        for request in batch
        for s in request.outputs
    ]


def test_the_engines_scheduler_names_this_class() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert resolve_obj_by_qualname(PROMPT_TAIL_SCHEDULER) is PromptTailScheduler


def test_samples_that_copy_the_tail_generate_what_vllms_scheduler_generates(outputs: dict[str, list[Any]]) -> None:
    ours, theirs = _samples(outputs[PROMPT_TAIL_SCHEDULER]), _samples(outputs[VLLM_SCHEDULER])
    assert len(ours) == len(theirs) == 2 * len(LENGTHS) * N
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(ours, theirs, strict=True):
        assert tokens == ref_tokens
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-5)


def test_the_prefix_cache_covers_all_but_the_last_prompt_token_where_a_tail_was_copied(
    outputs: dict[str, list[Any]],
) -> None:
    # num_cached_tokens of a request with n samples: its samples' prefix-cache hits, as vLLM reports them
    cached = {len(r.prompt_token_ids): r.num_cached_tokens for r in outputs[PROMPT_TAIL_SCHEDULER][1]}
    vllm_cached = {len(r.prompt_token_ids): r.num_cached_tokens for r in outputs[VLLM_SCHEDULER][1]}
    assert vllm_cached == {40: 32, 20: 0, 33: 32, 64: 32}  # full blocks only (63 tokens at most: one block)
    assert cached == {40: 39, 20: 19, 33: 32, 64: 32}
