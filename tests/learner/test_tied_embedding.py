"""learner/tied_embedding.py: a tied input embedding's gradient rows added into the output layer's in place give the
same gradient bits as autograd's dense embedding gradient and sum, in fp32 and bf16."""

from __future__ import annotations

import pytest
import torch
from _learner_testlib import tiny_policy
from torch import nn

from async_rl.learner.tied_embedding import TiedEmbeddingFunction, use_tied_embedding_rows


def _grads(model: nn.Module, ids: torch.Tensor, *, steps: int = 1) -> dict[str, torch.Tensor]:
    for _ in range(steps):  # more than one backward: the rows accumulate with the rest
        model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_rows_into_the_output_layers_gradient_equal_the_dense_path_bit_for_bit(
    dtype: torch.dtype, padding_idx: int | None
) -> None:
    dense, rows = tiny_policy(tie=True).to(dtype), tiny_policy(tie=True).to(dtype)
    for model in (dense, rows):
        model.get_input_embeddings().padding_idx = padding_idx
    assert use_tied_embedding_rows(rows) is True
    assert rows.get_input_embeddings().weight is rows.get_output_embeddings().weight  # still tied
    ids = torch.randint(1, 64, (6, 12), generator=torch.Generator().manual_seed(1))
    ids[0, :5] = 3  # repeated ids (summed per row) and, for padding_idx=3, the padding row
    g_dense, g_rows = _grads(dense, ids, steps=2), _grads(rows, ids, steps=2)
    assert g_dense.keys() == g_rows.keys() and len(g_dense) > 10
    for name in g_dense:
        assert torch.equal(g_dense[name], g_rows[name]), name
    weight = rows.get_input_embeddings().weight
    assert weight.grad is not None and weight.grad.abs().sum() > 0
    if padding_idx is not None:  # what the dense kernel does: nothing from the embedding for the padding row
        assert torch.equal(weight.grad[3], g_dense["model.embed_tokens.weight"][3])
    # the forward is the module's own: same outputs
    with torch.no_grad():
        assert torch.equal(dense(input_ids=ids).logits, rows(input_ids=ids).logits)


def test_untied_frozen_and_unusual_embeddings_keep_their_own_forward() -> None:
    assert use_tied_embedding_rows(tiny_policy(tie=False)) is False
    scaled = tiny_policy(tie=True)
    scaled.get_input_embeddings().scale_grad_by_freq = True
    assert use_tied_embedding_rows(scaled) is False
    frozen = tiny_policy(tie=True)
    assert use_tied_embedding_rows(frozen) is True
    frozen.requires_grad_(False)
    ids = torch.randint(1, 64, (2, 5))
    out = frozen.get_input_embeddings()(ids)
    assert out.grad_fn is None  # nothing to differentiate: the plain lookup


def test_a_backward_without_the_output_layer_raises_instead_of_dropping_the_rows() -> None:
    model = tiny_policy(tie=True)
    assert use_tied_embedding_rows(model)
    ids = torch.randint(1, 64, (2, 5))
    hidden = model.get_input_embeddings()(ids)  # the output layer takes no part in this loss
    with pytest.raises(RuntimeError, match="never reached the shared weight"):
        hidden.sum().backward()
    # the next, normal backward is unaffected by the failed one
    model.zero_grad(set_to_none=True)
    model(input_ids=ids).logits.sum().backward()
    assert model.get_input_embeddings().weight.grad is not None


def test_the_function_alone_adds_its_rows_into_the_weights_other_gradient() -> None:
    weight = nn.Parameter(torch.randn(10, 4))
    ids = torch.tensor([[1, 1, 7]])
    out = TiedEmbeddingFunction.apply(ids, weight, None)
    (out * 2.0).sum().add(weight.sum()).backward()  # weight.sum(): the "output layer's" gradient, ones
    expected = torch.ones(10, 4)
    expected[1] += 4.0  # id 1 twice
    expected[7] += 2.0
    assert torch.equal(weight.grad, expected)
