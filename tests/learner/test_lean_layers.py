"""Memory-lean RMSNorm, SwiGLU-MLP and written-out attention: the forward of the modules they replace, bit for bit;
their gradients within rounding; and less kept for the backward."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from async_rl.learner.lean_layers import RMSNormFunction, SwiGLUFunction, SwiGLUMLPFunction, use_lean_layers
from async_rl.learner.shared_prompt import math_attention


def _saved_bytes(fn, *args):  # type: ignore[no-untyped-def]
    """Bytes of distinct storages autograd keeps for the backward of ``fn(*args)``, and the output."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(seen.values()), out


def _grads(out: torch.Tensor, inputs: list[torch.Tensor], weights: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad((out.float() * weights).sum(), inputs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_forward_is_llamas_bit_for_bit_and_gradients_agree(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    norm = LlamaRMSNorm(64, eps=1e-6)
    norm.weight.data = torch.randn(64)
    norm = norm.to(dtype)
    x = torch.randn(3, 7, 64).to(dtype).requires_grad_()
    ref = norm(x)
    ours = RMSNormFunction.apply(x, norm.weight, 1e-6)
    assert torch.equal(ours, ref)
    weights = torch.randn(ref.shape)
    g_ref = _grads(ref, [x, norm.weight], weights)
    g_ours = _grads(ours, [x, norm.weight], weights)
    # fp32: the same formula in another order; bf16: the reference rounds after each op, ours once
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.02}
    for a, b in zip(g_ours, g_ref, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_rms_norm_keeps_its_input_and_one_number_per_row() -> None:
    norm = LlamaRMSNorm(64).to(torch.bfloat16)
    x = torch.randn(10, 64).to(torch.bfloat16).requires_grad_()
    ref_bytes, _ = _saved_bytes(norm, x)
    ours_bytes, _ = _saved_bytes(RMSNormFunction.apply, x, norm.weight, 1e-6)
    assert ours_bytes == x.nbytes + norm.weight.nbytes + 10 * 4  # x, weight, fp32 1 / rms per row
    assert ref_bytes >= ours_bytes + 10 * 64 * 4  # the chain keeps at least an fp32 copy of x more


def test_swiglu_gradients_match_autograd_in_float64() -> None:
    gate = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    up = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(SwiGLUFunction.apply, (gate, up))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_mlp_forward_is_llamas_bit_for_bit_and_gradients_agree(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, hidden_act="silu")
    mlp = LlamaMLP(cfg).to(dtype)
    x = torch.randn(2, 5, 32).to(dtype).requires_grad_()
    ref = mlp(x)
    params = [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
    ours = SwiGLUMLPFunction.apply(x, *params)
    assert torch.equal(ours, ref)
    weights = torch.randn(ref.shape)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.02}
    for a, b in zip(_grads(ours, [x, *params], weights), _grads(ref, [x, *params], weights), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a.float(), b.float(), **tol)
    # kept: x, gate, up and the weights; not silu(gate), nor the product that enters down_proj
    kept, _ = _saved_bytes(SwiGLUMLPFunction.apply, x, *params)
    assert kept == x.nbytes + 2 * 2 * 5 * 48 * x.element_size() + sum(p.nbytes for p in params)


class GemmaLikeRMSNorm(nn.Module):
    """An RMSNorm with another formula (``1 + weight``): must keep its own forward."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (out * (1.0 + self.weight.float())).to(x.dtype)


def _tiny_llama(**kw) -> LlamaForCausalLM:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, **kw,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).float()
    for p in model.parameters():  # norms away from their initial ones, so a wrong formula shows
        p.data.add_(0.1 * torch.randn_like(p))
    return model


def test_use_lean_layers_switches_what_matches_and_keeps_the_models_outputs() -> None:
    model = _tiny_llama()
    before = copy.deepcopy(model)
    assert use_lean_layers(model) == (2 * 2 + 1, 2)  # two norms a layer and the final one; one MLP a layer
    ids = torch.randint(0, 97, (2, 9))
    assert torch.equal(model(input_ids=ids).logits, before(input_ids=ids).logits)
    weights = torch.randn(2, 9, 97)
    (model(input_ids=ids).logits * weights).sum().backward()
    (before(input_ids=ids).logits * weights).sum().backward()
    for (name, a), (_, b) in zip(model.named_parameters(), before.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_use_lean_layers_leaves_other_formulas_and_wrapped_projections() -> None:
    model = _tiny_llama(hidden_act="gelu")
    model.model.norm = GemmaLikeRMSNorm(32)
    assert use_lean_layers(model) == (2 * 2, 0)  # not the Gemma-like norm, not the GELU MLPs
    assert "forward" not in vars(model.model.norm)
    assert all("forward" not in vars(layer.mlp) for layer in model.model.layers)
    # projections with a bias (or an adapter's wrapper) get the lean SwiGLU inside the module's own projections
    model = _tiny_llama(mlp_bias=True)
    before = copy.deepcopy(model)
    assert use_lean_layers(model) == (5, 2)
    x = torch.randn(3, 32)
    assert torch.equal(model.model.layers[0].mlp(x), before.model.layers[0].mlp(x))


@pytest.mark.parametrize("masked", [False, True])
def test_math_attention_under_grad_keeps_only_its_inputs_with_the_chains_values(masked: bool) -> None:
    """bf16, as the learner runs it on CPU: the output equals the chain of ops it replaced, gradients within one
    rounding of it, and autograd keeps q, k, v (and the mask) instead of fp32 copies and probabilities."""
    gen = torch.Generator().manual_seed(1)
    b, h, hkv, t, s, d = 3, 6, 2, 5, 5 if not masked else 9, 8
    q, k, v = (torch.randn(b, n, m, d, generator=gen).bfloat16() for n, m in ((h, t), (hkv, s), (hkv, s)))
    mask = torch.rand(b, 1, t, s, generator=gen) < 0.7 if masked else None
    if mask is not None:
        mask[..., 0] = True  # every query row sees a key

    def chain(q, k, v):  # type: ignore[no-untyped-def]  # the written-out attention as plain autograd ops
        scores = torch.matmul(q.reshape(b, hkv, (h // hkv) * t, d).float(), k.transpose(-1, -2).float())
        scores = scores.view(b, hkv, h // hkv, t, s) * 0.3
        allowed = torch.ones(t, s, dtype=torch.bool).tril() if mask is None else mask[:, :, None]
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return torch.matmul(probs.to(v.dtype).view(b, hkv, (h // hkv) * t, s), v).view(b, h, t, d)

    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref_bytes, ref = _saved_bytes(chain, *leaves)
    ours_bytes, ours = _saved_bytes(math_attention, *leaves, mask, 0.3)
    assert torch.equal(ours, ref)
    assert ours_bytes == sum(x.nbytes for x in leaves) + (0 if mask is None else mask.nbytes)
    assert ref_bytes > 2 * ours_bytes
    weights = torch.randn(ref.shape, generator=gen)
    for a, r in zip(_grads(ours, leaves, weights), _grads(ref, leaves, weights), strict=True):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), r.float(), atol=0.02, rtol=0.02)


def test_mlps_whose_projections_are_adapters_keep_calling_them() -> None:
    from async_rl.learner.lora import apply_lora
    from async_rl.peft_format import LoRASpec

    model = _tiny_llama()
    apply_lora(model, LoRASpec(rank=2, alpha=4.0, target_modules="all-linear"), seed=0)
    for name, p in model.named_parameters():
        if "lora" in name:  # adapters away from zero, so an MLP that bypassed them would differ
            p.data.normal_(0.0, 0.3)
    before = copy.deepcopy(model)
    assert use_lean_layers(model) == (5, 2)
    ids = torch.randint(0, 97, (2, 9))
    assert torch.equal(model(input_ids=ids).logits, before(input_ids=ids).logits)
    (model(input_ids=ids).logits.square().sum()).backward()
    (before(input_ids=ids).logits.square().sum()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None for g in grads.values())
    for name, p in before.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(grads[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_fused_mlp_under_autocast_computes_in_bf16_and_returns_fp32_gradients() -> None:
    """A single bf16 process runs fp32 weights under torch.autocast: the products in bf16, the gradients cast back."""
    torch.manual_seed(0)
    mlp = LlamaMLP(LlamaConfig(hidden_size=32, intermediate_size=48, hidden_act="silu"))
    x = torch.randn(2, 5, 32, requires_grad=True)
    params = [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = mlp(x)
        ours = SwiGLUMLPFunction.apply(x, *params)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, ref)
    weights = torch.randn(ref.shape)
    for a, b in zip(_grads(ours, [x, *params], weights), _grads(ref, [x, *params], weights), strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=0.05, rtol=0.02)
