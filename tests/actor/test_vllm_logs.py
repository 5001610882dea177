"""The filter on vLLM's expected load warnings (``async_rl.actor.vllm_logs``)."""

from __future__ import annotations

import logging

import torch

from async_rl.actor import vllm_logs
from async_rl.actor.vllm_logs import DOWNCAST, NOTHING_LOADED, VllmWarnings


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("vllm", logging.WARNING, __file__, 1, msg, args, None)


def test_the_first_cast_of_each_dtype_pair_is_kept_and_says_the_rest_are_left_out() -> None:
    f = VllmWarnings()
    first = _record(DOWNCAST, "embed_tokens.weight", torch.float32, torch.bfloat16)
    assert f.filter(first) and "further weights cast the same way are not logged" in first.getMessage()
    assert "embed_tokens.weight with dtype torch.float32 into parameter with dtype torch.bfloat16" in first.getMessage()
    assert not f.filter(_record(DOWNCAST, "layers.0.mlp.down_proj.weight", torch.float32, torch.bfloat16))
    assert f.filter(_record(DOWNCAST, "layers.0.mlp.down_proj.weight", torch.float32, torch.float16))  # another cast


def test_layers_that_load_nothing_by_design_are_left_out_and_others_still_warn() -> None:
    f = VllmWarnings()
    f.tied_classes.add("ParallelLMHead")
    assert not f.filter(_record(NOTHING_LOADED, "RotaryEmbedding"))
    assert not f.filter(_record(NOTHING_LOADED, "Llama3RotaryEmbedding"))
    assert not f.filter(_record(NOTHING_LOADED, "ParallelLMHead"))
    assert f.filter(_record(NOTHING_LOADED, "QKVParallelLinear"))
    assert f.filter(_record("something else %s", "ParallelLMHead"))


def test_install_attaches_one_filter_to_the_loggers_vllm_warns_on() -> None:
    from vllm.model_executor.model_loader.reload import layerwise
    from vllm.model_executor.models import utils

    f = vllm_logs.install()
    assert vllm_logs.install() is f
    for logger in (utils.logger, layerwise.logger):
        assert logger.filters.count(f) == 1
