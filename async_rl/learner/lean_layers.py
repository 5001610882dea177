"""Memory-lean RMSNorm and SwiGLU MLP for the learner: the same forward values, a smaller autograd footprint.

Written as a chain of torch ops (transformers' ``LlamaRMSNorm`` and ``LlamaMLP``, shared by Qwen2, Mistral and
others), autograd keeps, per token and decoder layer:

* RMSNorm: an fp32 copy of the input (for ``pow`` and the multiply by ``rsqrt``) and the normalised input before the
  weight multiply: in bf16, ``4 + 2`` bytes per hidden unit, twice a layer;
* the MLP ``down(silu(gate) * up)``: the gate (for ``silu``'s backward), ``silu(gate)`` and ``up`` (for the
  product's), and the product (for ``down``'s weight gradient).

:class:`RMSNormFunction` keeps the input (model dtype) and one fp32 number per row (``1 / rms``) and recomputes the
normalised row in its backward (its gradients: the same formula in fp32, rounded once at the end).
:class:`SwiGLUMLPFunction` keeps the MLP's input, the gate and ``up`` and recomputes ``silu(gate)`` and the product
in its backward, with the very ops autograd runs for the chain; :class:`SwiGLUFunction` is its middle alone, for MLPs
whose projections are adapters or have biases. On SmolLM2-135M without activation checkpointing that is about 14 KB
less per token in bf16 (30 layers x (2 x 576 x 4 bytes + 2 x 1,536 x 2 bytes)). The forward runs the very ops of the
module it replaces, so outputs are bit-identical.

:func:`use_lean_layers` switches a model's RMSNorm and SwiGLU-MLP modules over, each only after a probe on random
inputs shows the replacement's output equal, bit for bit, to the module's own (a norm with another formula, e.g.
Gemma's ``1 + weight``, or an MLP with another activation, keeps its forward).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

__all__ = ["RMSNormFunction", "SwiGLUFunction", "SwiGLUMLPFunction", "lean_rms_norm", "lean_swiglu", "use_lean_layers"]


class RMSNormFunction(torch.autograd.Function):
    """``weight * (x / rms(x)).to(x.dtype)`` with ``rms`` computed in fp32 over the last dim (``x [..., H]``,
    ``weight [H]``), saving ``x`` and ``1 / rms`` (``[..., 1]``, fp32) for the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        x32 = x.to(torch.float32)
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        out = weight * (x32 * rstd).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(torch.float32) * rstd  # the normalised row, fp32
        g32 = grad_out.to(torch.float32)
        grad_w = None
        if ctx.needs_input_grad[1]:
            normed = xhat.to(x.dtype).to(torch.float32)  # what the weight multiplied in the forward
            grad_w = (g32 * normed).reshape(-1, normed.shape[-1]).sum(0).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            g = g32.mul_(weight.to(torch.float32))  # d/d(normalised row); g32 is not needed after this
            # d/dx of x * rsqrt(mean(x^2) + eps) applied to g: rstd * (g - xhat * mean(g * xhat))
            grad_x = (g - xhat * (g * xhat).mean(-1, keepdim=True)).mul_(rstd).to(x.dtype)
        return grad_x, grad_w, None


class SwiGLUFunction(torch.autograd.Function):
    """``silu(gate) * up`` (same shapes), saving ``gate`` and ``up`` only; ``silu`` is recomputed in the backward."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(gate, up)
        return nn.functional.silu(gate) * up

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:  # type: ignore[override]
        gate, up = ctx.saved_tensors
        need_gate, need_up = ctx.needs_input_grad[:2]
        return _swiglu_backward(gate, up, grad_out, need_gate=need_gate, need_up=need_up)


class SwiGLUMLPFunction(torch.autograd.Function):
    """The whole MLP, ``down(silu(x @ gate.T) * (x @ up.T))`` with bias-free projections, saving ``x``, the gate and
    ``up`` (and the weights, as a linear layer does): the product that enters ``down`` is recomputed in the backward
    instead of kept (``[..., intermediate]`` per token)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
    ) -> torch.Tensor:
        gate = nn.functional.linear(x, w_gate)
        up = nn.functional.linear(x, w_up)
        ctx.save_for_backward(x, gate, up, w_gate, w_up, w_down)
        return nn.functional.linear(nn.functional.silu(gate) * up, w_down)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, gate, up, w_gate, w_up, w_down = ctx.saved_tensors
        need_x, need_g, need_u, need_d = ctx.needs_input_grad[:4]
        # the products ran in the gate's dtype: under autocast (a single bf16 process) the fp32 weights and input were
        # cast for them, and their gradients are cast back, as autocast's cast nodes do
        dtype = gate.dtype
        wg, wu, wd = (w.to(dtype) for w in (w_gate, w_up, w_down))
        dout = grad_out.to(dtype).reshape(-1, grad_out.shape[-1])
        silu = nn.functional.silu(gate)
        grad_down = dout.t().mm((silu * up).reshape(-1, up.shape[-1])).to(w_down.dtype) if need_d else None
        grad_hidden = dout.mm(wd).view(up.shape)
        grad_gate, grad_up = _swiglu_backward(gate, up, grad_hidden, need_gate=True, need_up=True, silu=silu)
        assert grad_gate is not None and grad_up is not None
        del silu, grad_hidden
        flat_x = x.to(dtype).reshape(-1, x.shape[-1])
        flat_g, flat_u = grad_gate.reshape(-1, gate.shape[-1]), grad_up.reshape(-1, up.shape[-1])
        grad_w_gate = flat_g.t().mm(flat_x).to(w_gate.dtype) if need_g else None
        grad_w_up = flat_u.t().mm(flat_x).to(w_up.dtype) if need_u else None
        grad_x = flat_g.mm(wg).addmm_(flat_u, wu).view(x.shape).to(x.dtype) if need_x else None
        return grad_x, grad_w_gate, grad_w_up, grad_down


def _swiglu_backward(
    gate: torch.Tensor,
    up: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    need_gate: bool,
    need_up: bool,
    silu: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``silu(gate) * up`` w.r.t. ``gate`` and ``up``: the ops autograd runs for the chain (the product's
    two multiplies and ``silu``'s own backward kernel), the same values; ``silu(gate)`` is recomputed unless given."""
    grad_up = None
    if need_up:
        grad_up = grad_out * (nn.functional.silu(gate) if silu is None else silu)
    grad_gate = torch.ops.aten.silu_backward(grad_out * up, gate) if need_gate else None
    return grad_gate, grad_up


def lean_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:class:`RMSNormFunction` as a function."""
    return RMSNormFunction.apply(x, weight, eps)  # type: ignore[no-any-return]


def lean_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:class:`SwiGLUFunction` as a function."""
    return SwiGLUFunction.apply(gate, up)  # type: ignore[no-any-return]


def _norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return lean_rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(lean_swiglu(self.gate_proj(x), self.up_proj(x)))


def _fused_mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    weights = (self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)
    return SwiGLUMLPFunction.apply(x, *weights)  # type: ignore[no-any-return]


def _plain_projections(module: nn.Module) -> bool:
    """The MLP's three projections are bias-free ``nn.Linear`` layers (not adapters or other wrappers)."""
    parts = [getattr(module, name) for name in ("gate_proj", "up_proj", "down_proj")]
    return all(type(p) is nn.Linear and p.bias is None for p in parts)


def _is_norm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(weight, nn.Parameter)
        and weight.ndim == 1
        and isinstance(getattr(module, "variance_epsilon", None), float)
    )


def _is_swiglu_mlp(module: nn.Module) -> bool:
    parts = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    act = getattr(module, "act_fn", None)
    return all(isinstance(p, nn.Module) for p in parts) and isinstance(act, nn.SiLU | _hf_silu())


def _hf_silu() -> type:
    try:  # transformers' own SiLU module (ACT2FN["silu"]); nn.SiLU in some releases
        from transformers.activations import SiLUActivation

        return SiLUActivation  # type: ignore[no-any-return]
    except ImportError:
        return nn.SiLU


def _probe_input(module: nn.Module, width: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(3, 5, width, generator=gen).to(dtype=dtype, device=next(module.parameters()).device)


def _matches(module: nn.Module, lean: Any, width: int) -> bool:
    """Whether ``lean`` bound to ``module`` gives the module's own output, bit for bit, in fp32 and bf16."""
    bound = types.MethodType(lean, module)
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            x = _probe_input(module, width, dtype)
            if dtype != torch.float32:  # the probe runs the module in dtype, as FSDP2's mixed precision does
                saved = {n: p.data for n, p in module.named_parameters()}
                try:
                    for p in module.parameters():
                        p.data = p.data.to(dtype)
                    ok = torch.equal(module.forward(x), bound(x))
                finally:
                    for n, p in module.named_parameters():
                        p.data = saved[n]
            else:
                ok = torch.equal(module.forward(x), bound(x))
            if not ok:
                return False
    return True


def use_lean_layers(model: nn.Module) -> tuple[int, int]:
    """Switch ``model``'s RMSNorm and SwiGLU-MLP modules to the lean functions where a probe shows equal outputs
    (before sharding: the probe runs the modules on their own parameters). Returns ``(norms, mlps)`` switched."""
    norms = mlps = 0
    for module in model.modules():
        parts: Any = module  # duck-typed: the checks below say which attributes it has
        if _is_norm(module) and _matches(module, _norm_forward, int(parts.weight.shape[0])):
            module.forward = types.MethodType(_norm_forward, module)  # type: ignore[method-assign]
            norms += 1
        elif _is_swiglu_mlp(module):
            lean = _fused_mlp_forward if _plain_projections(module) else _mlp_forward
            width = getattr(parts.gate_proj, "in_features", None)  # nn.Linear and the LoRA wrapper have it
            if isinstance(width, int) and _matches(module, lean, width):
                module.forward = types.MethodType(lean, module)  # type: ignore[method-assign]
                mlps += 1
    return norms, mlps
