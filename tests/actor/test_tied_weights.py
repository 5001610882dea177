"""TiedParameters on a stand-in of vLLM's tied output layer: a kernel that packs a copy of its weight when processed,
as vLLM's CPU build does for the output layer's oneDNN matmul."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from async_rl.actor.tied_weights import TiedParameters
from async_rl.weight_sync.errors import WeightMismatchError


class _PackingMethod:
    """Computes with a copy of the weight taken when the layer is processed (the packed kernel)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.packed = layer.weight.detach().clone()

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return x @ layer.packed.t()


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Module()
        self.head.quant_method = _PackingMethod()
        self.head.weight = self.embed.weight  # tied
        self.head.quant_method.process_weights_after_loading(self.head)


def test_a_tied_head_computes_with_the_reloaded_embedding_again() -> None:
    torch.manual_seed(0)
    model = _Model()
    ties = TiedParameters(model)
    assert ties.names == ["head.weight"]  # the norm's parameters are nobody else's
    ties.check()
    with torch.no_grad():
        model.embed.weight.add_(0.01)  # a reload copies the new values into the shared parameter
    with pytest.raises(WeightMismatchError, match="head.weight does not compute with the updated embed.weight"):
        ties.check()  # the packed kernel still holds the first load's weights
    ties.restore()
    ties.check()
    x = torch.randn(3, 6)
    assert torch.equal(model.head.quant_method.apply(model.head, x), x @ model.embed.weight.detach().t())


def test_a_reload_that_replaced_the_leaders_parameter_ties_the_follower_to_it_again() -> None:
    model = _Model()
    ties = TiedParameters(model, probe_columns=2)
    model.embed.weight = nn.Parameter(torch.full((10, 6), 0.5))  # a new parameter for the layer that loaded
    with pytest.raises(WeightMismatchError, match="head.weight no longer shares embed.weight"):
        ties.check()
    ties.restore()
    assert model.head.weight is model.embed.weight
    ties.check()
    assert torch.equal(model.head.packed, torch.full((10, 6), 0.5))


def test_an_untied_model_has_nothing_to_restore() -> None:
    ties = TiedParameters(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    assert ties.ties == [] and ties.names == []
    ties.restore()
    ties.check()


def test_tied_classes_are_named_for_the_log_filter() -> None:
    assert TiedParameters(_Model()).classes == {"Module"}
