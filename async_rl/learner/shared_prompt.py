"""Shared-prompt attention: each group's prompt is computed once, however many completions it has (pure tensor math).

GRPO samples ``n`` completions of one prompt. Laid out as separate sequences, the learner runs the prompt ``n`` times
(forward and backward). The shared layout puts one copy of a group's prompt in front of its completions,
``[prompt | completion 1 | ... | completion m]``, with every completion's position ids continuing from the end of the
prompt, and gives each completion the attention it had as a separate sequence: the prompt plus its own earlier
tokens. Log-probs, entropies, values and gradients are then those of the ``m`` separate sequences (up to float
summation order), while the projections and MLPs, which dominate the cost, run on each prompt token once.

A micro-batch becomes one padding-free row of all its group pieces (a group split across micro-batches is a piece in
each, with its own copy of the prompt). Inside every attention layer, :func:`shared_prompt_attention` gathers that row
into two dense problems, neither of which materialises a ``[L, L]`` mask:

* prompts ``[G, H, P, D]`` (right-padded to the longest prompt): causal self-attention (``is_causal``; a padded
  query's output is never read back);
* completions ``[N, H, T, D]`` (right-padded) attend to ``[their group's prompt keys | their own keys]``,
  ``[N, H, P + T, D]``, under a ``[N, 1, T, P + T]`` boolean mask (prompt padding out, causal within the
  completion): ``N x T x (P + T)`` scores, what the separate sequences would cost, not the square of the row.

and scatters both results back into row order. Each dense problem goes to ``torch``'s scaled-dot-product attention,
so the same code runs on CPU and on CUDA kernels.

On CUDA in bf16/fp16, where ``torch`` has its variable-length flash kernel (``torch.nn.attention.varlen``), the row
is attended as it lies instead (:func:`varlen_shared_attention`): the queries are the row itself, cut into segments
(a prompt, then each completion), and each segment's keys are gathered as ``[prompt]`` for a prompt and
``[its prompt | itself]`` for a completion, under bottom-right causal alignment, so a completion's first token sees
the whole prompt. No padding, no mask tensor, no scatter: only the (grouped, few-headed) keys and values are copied.
The dense path was 1.5x slower than separate sequences on an H200 (docs/benchmarks.md).

The function is registered with transformers' attention interface under :data:`SHARED_PROMPT_ATTENTION`; a model
switched to it (:func:`use_shared_prompt_attention`) behaves exactly like ``sdpa`` whenever a forward call passes no
``shared_layout`` keyword (probes, other layouts), and gradient checkpointing replays the keyword with the layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

__all__ = [
    "SHARED_PROMPT_ATTENTION",
    "SharedLayout",
    "build_shared_layout",
    "dense_shared_attention",
    "shared_prompt_attention",
    "shared_prompt_enabled",
    "use_shared_prompt_attention",
    "varlen_shared_attention",
    "varlen_supported",
]

SHARED_PROMPT_ATTENTION = "sdpa_shared_prompt"
"""The attention implementation name a learner model is switched to (plain ``sdpa`` without a layout)."""


@dataclass(frozen=True)
class SharedLayout:
    """Where each token of a shared-prompt row sits, for the attention gathers (``L`` real tokens, no padding).

    ``prompt_index`` ``[G, P]``: row positions of piece ``g``'s prompt tokens, right-padded with 0 (their outputs
    are discarded); ``comp_index`` ``[N, T]``: row positions of completion ``i``'s tokens, right-padded with 0;
    ``comp_group`` ``[N]``: the piece of completion ``i``; ``comp_mask`` ``[N, 1, T, P + T]``: what each completion
    query may attend to; ``inverse`` ``[L]``: for each row position, its slot in the flattened
    ``[G * P + N * T]`` outputs of the two dense problems.

    The variable-length form: the row is ``S = G + N`` query segments in row order (each prompt, then its
    completions), ``cu_seq_q`` ``[S + 1]`` (int32) their boundaries; ``kv_index`` ``[K]``: the row positions of
    every segment's keys, back to back (a prompt's own tokens; a completion's prompt then its own tokens);
    ``cu_seq_k`` ``[S + 1]`` (int32) their boundaries; ``max_q`` / ``max_k`` the longest segment of each.
    """

    prompt_index: torch.Tensor
    comp_index: torch.Tensor
    comp_group: torch.Tensor
    comp_mask: torch.Tensor
    inverse: torch.Tensor
    kv_index: torch.Tensor
    cu_seq_q: torch.Tensor
    cu_seq_k: torch.Tensor
    max_q: int
    max_k: int

    def to(self, device: torch.device) -> SharedLayout:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        moved: dict[str, Any] = {k: v.to(device) for k, v in values.items() if isinstance(v, torch.Tensor)}
        return replace(self, **moved)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (
            self.prompt_index,
            self.comp_index,
            self.comp_group,
            self.comp_mask,
            self.inverse,
            self.kv_index,
            self.cu_seq_q,
            self.cu_seq_k,
        )


def build_shared_layout(prompt_lengths: Sequence[int], completion_lengths: Sequence[Sequence[int]]) -> SharedLayout:
    """The layout of a row holding piece ``g``'s prompt (``prompt_lengths[g]`` tokens) followed by its completions
    (``completion_lengths[g]``), pieces back to back in the given order. Every prompt and completion is non-empty."""
    if len(prompt_lengths) != len(completion_lengths) or not prompt_lengths:
        raise ValueError("need one list of completion lengths per prompt, and at least one prompt")
    if min(prompt_lengths) < 1 or any(not c or min(c) < 1 for c in completion_lengths):
        raise ValueError("every prompt and every completion needs at least one token (and a piece one completion)")
    g_count, p_max = len(prompt_lengths), max(prompt_lengths)
    flat_t = [t for comps in completion_lengths for t in comps]
    n_count, t_max = len(flat_t), max(flat_t)
    length = sum(prompt_lengths) + sum(flat_t)
    prompt_index = torch.zeros(g_count, p_max, dtype=torch.long)
    comp_index = torch.zeros(n_count, t_max, dtype=torch.long)
    comp_group = torch.zeros(n_count, dtype=torch.long)
    inverse = torch.empty(length, dtype=torch.long)
    kv_pieces: list[torch.Tensor] = []
    q_lens: list[int] = []
    k_lens: list[int] = []
    offset, i = 0, 0
    for g, (pl, comps) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        prompt_pos = torch.arange(offset, offset + pl)
        prompt_index[g, :pl] = prompt_pos
        inverse[offset : offset + pl] = torch.arange(g * p_max, g * p_max + pl)
        kv_pieces.append(prompt_pos)
        q_lens.append(pl)
        k_lens.append(pl)
        offset += pl
        for tl in comps:
            own = torch.arange(offset, offset + tl)
            comp_index[i, :tl] = own
            base = g_count * p_max + i * t_max
            inverse[offset : offset + tl] = torch.arange(base, base + tl)
            comp_group[i] = g
            kv_pieces.extend((prompt_pos, own))
            q_lens.append(tl)
            k_lens.append(pl + tl)
            offset += tl
            i += 1
    p_lens = torch.tensor(list(prompt_lengths), dtype=torch.long)
    t_lens = torch.tensor(flat_t, dtype=torch.long)
    prompt_ok = torch.arange(p_max)[None, :] < p_lens[comp_group][:, None]  # [N, P]
    causal = torch.ones(t_max, t_max, dtype=torch.bool).tril()  # a padded query still sees its prompt: no empty row
    own_ok = causal[None] & (torch.arange(t_max)[None, None, :] < t_lens[:, None, None])  # [N, T, T]
    mask = torch.cat([prompt_ok[:, None, :].expand(n_count, t_max, p_max), own_ok], dim=2)

    def cumulative(lengths: list[int]) -> torch.Tensor:
        return torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)

    return SharedLayout(
        prompt_index,
        comp_index,
        comp_group,
        mask[:, None],
        inverse,
        kv_index=torch.cat(kv_pieces),
        cu_seq_q=cumulative(q_lens),
        cu_seq_k=cumulative(k_lens),
        max_q=max(q_lens),
        max_k=max(k_lens),
    )


def _varlen_kernel() -> tuple[Any, frozenset[str]] | None:
    """``torch``'s variable-length flash attention and its keyword names (they changed between releases), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    import inspect

    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


_VARLEN = _varlen_kernel()


def varlen_supported(query: torch.Tensor) -> bool:
    """Whether :func:`varlen_shared_attention` can run on ``query`` (a CUDA flash kernel: bf16 or fp16 only)."""
    return _VARLEN is not None and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16)


def shared_prompt_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    shared_layout: SharedLayout | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (``query`` ``[1, H, L, D]``, ``key``/``value`` ``[1, Hkv, L, D]``;
    returns ``[1, L, H, D]``). Without ``shared_layout`` it is transformers' ``sdpa`` attention, unchanged."""
    if shared_layout is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError(f"a shared-prompt row is one sequence of pieces, got a batch of {query.shape[0]}")
    if varlen_supported(query):
        return varlen_shared_attention(query, key, value, shared_layout, scaling), None
    return dense_shared_attention(query, key, value, shared_layout, scaling), None


def varlen_shared_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lay: SharedLayout, scaling: float | None
) -> torch.Tensor:
    """The row attended segment by segment with the variable-length flash kernel (``[1, L, H, D]`` out); see the
    module doc. Only where :func:`varlen_supported`."""
    assert _VARLEN is not None
    kernel, names = _VARLEN
    q = query[0].transpose(0, 1).contiguous()  # [L, H, D]: the queries are the row as it lies
    k = key[0].transpose(0, 1).index_select(0, lay.kv_index)  # [K, Hkv, D]
    v = value[0].transpose(0, 1).index_select(0, lay.kv_index)
    kwargs: dict[str, Any] = {}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in names:
            kwargs["enable_gqa"] = True
        else:
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    if "window_size" in names:
        kwargs["window_size"] = (-1, 0)  # causal, aligned to the bottom right (the keys' end)
    else:
        kwargs["is_causal"] = True
    if scaling is not None:
        if "scale" in names:
            kwargs["scale"] = scaling
        else:
            q = q * (scaling * q.shape[-1] ** 0.5)
    out = kernel(q, k, v, lay.cu_seq_q, lay.cu_seq_k, lay.max_q, lay.max_k, **kwargs)
    return out[None]


def dense_shared_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lay: SharedLayout, scaling: float | None
) -> torch.Tensor:
    """The row gathered into the two dense problems of the module doc (``[1, L, H, D]`` out); any device and dtype."""
    # grouped-query heads stay grouped (enable_gqa): no copy of the keys and values per query head
    gqa = query.shape[1] != key.shape[1]
    q, k, v = query[0], key[0], value[0]  # [H, L, D], [Hkv, L, D]
    g_count, p_max = lay.prompt_index.shape
    n_count, t_max = lay.comp_index.shape

    def gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # [H, L, D] -> [rows, H, width, D]
        return x.index_select(1, index.reshape(-1)).unflatten(1, index.shape).transpose(0, 1)

    qp, kp, vp = (gather(x, lay.prompt_index) for x in (q, k, v))
    out_p = _attend(qp, kp, vp, None, scaling, gqa)
    qc = gather(q, lay.comp_index)
    kc = torch.cat([kp.index_select(0, lay.comp_group), gather(k, lay.comp_index)], dim=2)
    vc = torch.cat([vp.index_select(0, lay.comp_group), gather(v, lay.comp_index)], dim=2)
    out_c = _attend(qc, kc, vc, lay.comp_mask, scaling, gqa)
    heads, dim = q.shape[0], q.shape[2]
    flat = torch.cat(
        [
            out_p.transpose(1, 2).reshape(g_count * p_max, heads, dim),
            out_c.transpose(1, 2).reshape(n_count * t_max, heads, dim),
        ]
    )
    return flat.index_select(0, lay.inverse)[None]


MATH_ATTENTION_MAX_SCORES = 1 << 22
"""On CPU, a dense problem with at most this many attention scores (rows x heads x queries x keys) is computed by
:func:`math_attention`, larger ones by ``torch``'s flash kernel. The learner's problems are many short rows (a
micro-batch of completions of a few dozen tokens), where the CPU flash kernel's per-block set-up dominates: on the
SmolLM2 recipe's micro-batch (bf16, one thread, forward and backward) a layer's attention took 49 ms with the flash
kernel against 21 ms written out (docs/architecture.md, "The learner"). In fp32 the flash kernel is as fast and kept."""


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scaling: float | None, gqa: bool
) -> torch.Tensor:
    """Scaled-dot-product attention of one dense problem: causal when ``mask`` is None, else under ``mask``."""
    scores = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
    if q.device.type == "cpu" and q.dtype != torch.float32 and scores <= MATH_ATTENTION_MAX_SCORES:
        return math_attention(q, k, v, mask, scaling)
    causal = mask is None
    return nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scaling, enable_gqa=gqa
    )


def math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scaling: float | None
) -> torch.Tensor:
    """Attention written out: ``q`` ``[B, H, T, D]``, ``k``/``v`` ``[B, Hkv, S, D]`` (``H`` a multiple of ``Hkv``;
    query head ``h`` reads key head ``h // (H / Hkv)``, as ``enable_gqa``), ``mask`` ``[B, 1, T, S]`` (True: may
    attend) or None for causal attention aligned to the top left (``T == S``). The scores and their softmax in fp32 (as
    flash kernels keep them), the weighted sum of values in the inputs' dtype; every query row must see a key.

    Under grad it keeps only ``q``, ``k``, ``v`` (and the mask) for the backward, which recomputes the scores and
    their softmax (:class:`_MathAttention`), as flash kernels do: the fp32 copies and probabilities a chain of ops
    would keep are 4-5x the inputs' size (on the SmolLM2 recipe's micro-batch, 225 of 315 MiB over 30 layers)."""
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _MathAttention.apply(q, k, v, mask, scale)  # type: ignore[no-any-return]
    return _math_attention_forward(q, k, v, mask, scale)


def _attention_probs(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 ``q`` as ``[B, Hkv, rep * T, D]``, fp32 ``k``, and the softmax of the masked, scaled scores ``[B, Hkv,
    rep, T, S]`` (the query heads that share a key head are rows of one product: no copy of the keys per head)."""
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    rep = h // hkv
    q32, k32 = q.reshape(b, hkv, rep * t, d).float(), k.float()
    scores = torch.matmul(q32, k32.transpose(-1, -2)).view(b, hkv, rep, t, s)
    allowed = torch.ones(t, s, dtype=torch.bool, device=q.device).tril() if mask is None else mask[:, :, None]
    return q32, k32, torch.softmax((scores * scale).masked_fill(~allowed, float("-inf")), dim=-1)


def _math_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """The output ``[B, H, T, D]``: the probabilities' weighted sum of values, in the values' dtype."""
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    probs = _attention_probs(q, k, mask, scale)[2]
    return torch.matmul(probs.to(v.dtype).view(b, hkv, (h // hkv) * t, s), v).view(b, h, t, d)


class _MathAttention(torch.autograd.Function):
    """:func:`math_attention` under grad: saves the inputs only; the backward recomputes the probabilities (the same
    ops as the forward, so the same values) and applies the chain rule of the forward's ops, in the same dtypes."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
    ) -> torch.Tensor:
        out = _math_attention_forward(q, k, v, mask, scale)
        ctx.save_for_backward(q, k, v, mask)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None, None]:
        q, k, v, mask = ctx.saved_tensors
        b, h, t, d = q.shape
        hkv, s = k.shape[1], k.shape[2]
        rows = (h // hkv) * t
        q32, k32, probs = _attention_probs(q, k, mask, ctx.scale)
        p = probs.view(b, hkv, rows, s)
        g = grad_out.reshape(b, hkv, rows, d)
        grad_v = torch.matmul(p.to(v.dtype).transpose(-1, -2), g) if ctx.needs_input_grad[2] else None
        grad_q = grad_k = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            dp = torch.matmul(g, v.transpose(-1, -2)).float()  # d/d(probs in v's dtype), back to fp32 as the cast's
            ds = p * (dp - (dp * p).sum(-1, keepdim=True))  # softmax backward; masked entries have p = 0
            ds.mul_(ctx.scale)
            if ctx.needs_input_grad[0]:
                grad_q = torch.matmul(ds, k32).to(q.dtype).view(b, h, t, d)
            if ctx.needs_input_grad[1]:
                grad_k = torch.matmul(ds.transpose(-1, -2), q32).to(k.dtype)
        return grad_q, grad_k, grad_v, None, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SHARED_PROMPT_ATTENTION, shared_prompt_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SHARED_PROMPT_ATTENTION, sdpa_mask)


def use_shared_prompt_attention(model: nn.Module) -> bool:
    """Switch a transformers model (and every sub-config) to :data:`SHARED_PROMPT_ATTENTION`; False (unchanged) when
    the model does not dispatch attention through transformers' interface (a model class of its own)."""
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None:
        return False
    _register()
    try:
        setter(SHARED_PROMPT_ATTENTION)
    except (ValueError, NotImplementedError):
        return False
    return True


def shared_prompt_enabled(model: nn.Module) -> bool:
    """Whether ``model`` computes attention with :func:`shared_prompt_attention` (it takes the shared layout)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == SHARED_PROMPT_ATTENTION
