"""Forward passes over one micro-batch: per-token log-probs (and entropy) of response tokens, or critic values.

Two input layouts produce the same ``[b, T]`` outputs:

* padded: the micro-batch is cut from the batch's ``[prompt | response]`` rows and trimmed to its own longest prompt
  and response; logits at positions ``p-1 .. p+t-2`` predict the ``t`` response tokens.
* packed (``use_remove_padding``): the micro-batch's sequences, stripped of padding, are bin-packed (first fit
  decreasing) into rows no longer than its longest sequence, each row concatenating whole sequences with
  ``position_ids`` restarting at 0 per sequence and no attention mask. transformers 5.19 detects the restarts
  (``masking_utils.find_packed_sequence_indices``) and builds a block-diagonal causal mask, so each sequence attends
  only to itself with the sdpa/eager kernels (tests check packed == per-sequence log-probs). Rows as long as the
  longest sequence keep sdpa's dense-mask attention cost at or below the padded layout's (one row holding the whole
  micro-batch would make it quadratic in the micro-batch's token count); a varlen flash-attention kernel would not
  need the cap, but none is installed here.

Only logits at positions that predict response tokens are materialised (``logits_to_keep`` with explicit positions;
packed: their union over rows), the log-softmax runs in fp32 and logits are divided by the sampling temperature
first, as vLLM did when sampling; it is computed a chunk of rows at a time, backward included, so large vocabularies
need no fp32 copy of the whole logit matrix. With the fused output layer (``use_fused_kernels``, ``output_layer.py``)
the logits are not kept at all: the output layer computes the log-probs from the hidden states a chunk at a time.

:func:`forward_full_batch` runs a no-grad pass over the whole step batch, each rank on its balanced share, and
all-gathers the result so every rank ends up with the same ``[B, T]`` tensor (old/ref log-probs, values): advantages
need whole groups, and later epochs may hand any row to any rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from async_rl.algorithms import token_log_probs_and_entropy
from async_rl.learner.batching import RolloutBatch
from async_rl.learner.dist import DistContext
from async_rl.learner.output_layer import FusedRequest, fused_log_probs, fused_output_layer
from async_rl.learner.partition import LAYOUTS, Layout, pack_rows, plan_forward
from async_rl.learner.shared_prompt import SharedLayout, build_shared_layout

__all__ = [
    "LAYOUTS",
    "Layout",
    "MicroInputs",
    "build_micro_inputs",
    "forward_full_batch",
    "response_log_probs",
    "response_logits",
    "response_values",
    "row_groups",
    "to_full_width",
]


@dataclass
class MicroInputs:
    """Model inputs for one micro-batch plus where its response tokens sit."""

    input_ids: torch.Tensor  # [b, L] padded, [R, L] packed rows
    attention_mask: torch.Tensor | None  # None when packed
    position_ids: torch.Tensor
    keep: torch.Tensor  # 1-D positions whose logits are computed (those predicting response tokens)
    labels: torch.Tensor  # response token ids: [b, t] padded, [n] packed (one per response token, row-major)
    response_mask: torch.Tensor  # [b, T] bool, full batch width
    # packed and shared: for each response token (micro-batch row-major order), its row and predicting position
    token_row: torch.Tensor | None = None
    token_pos: torch.Tensor | None = None
    shared: SharedLayout | None = None  # shared only: the attention gathers of the one row

    def model_kwargs(self) -> dict[str, Any]:
        """The model-call keywords of this layout (the shared one hands its gathers to the attention layers)."""
        kwargs: dict[str, Any] = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "use_cache": False,
        }
        if self.shared is not None:
            kwargs["shared_layout"] = self.shared
        return kwargs

    @property
    def packed(self) -> bool:
        return self.token_row is not None

    @property
    def num_slots(self) -> int:
        """Token slots the forward pass computes (real tokens + padding)."""
        return int(self.input_ids.numel())


def build_micro_inputs(batch: RolloutBatch, rows: list[int], *, layout: Layout, device: torch.device) -> MicroInputs:
    """Gather rows ``rows`` of ``batch`` into model inputs on ``device`` (see module docstring for the layouts)."""
    if not rows:
        raise ValueError("rows must not be empty")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    idx = torch.as_tensor(rows, dtype=torch.long)
    width_p = batch.prompt_width
    p_lens = batch.prompt_lengths.index_select(0, idx).tolist()
    t_lens = batch.response_lengths.index_select(0, idx).tolist()
    response_mask = batch.response_mask.index_select(0, idx).bool()
    input_ids = batch.input_ids.index_select(0, idx)
    if layout == "shared":
        groups = batch.index.index_select(0, idx).tolist()
        return _shared_inputs(input_ids, width_p, p_lens, t_lens, groups, response_mask, device)
    if layout == "padded":
        p, t = max(p_lens), max(t_lens)
        sl = slice(width_p - p, width_p + t)
        return MicroInputs(
            input_ids=input_ids[:, sl].to(device),
            attention_mask=batch.attention_mask.index_select(0, idx)[:, sl].to(device),
            position_ids=batch.position_ids.index_select(0, idx)[:, sl].to(device),
            keep=torch.arange(p - 1, p + t - 1, device=device),
            labels=batch.responses.index_select(0, idx)[:, :t].to(device),
            response_mask=response_mask.to(device),
        )
    lengths = [pl + tl for pl, tl in zip(p_lens, t_lens, strict=True)]
    packing = pack_rows(lengths, max(lengths))
    width = max(sum(lengths[j] for j in row) for row in packing)
    ids = torch.zeros((len(packing), width), dtype=torch.long)
    pos = torch.zeros((len(packing), width), dtype=torch.long)
    token_row: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * len(rows)
    token_pos: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * len(rows)
    for r, row in enumerate(packing):
        offset = 0
        for j in row:
            pl, tl = p_lens[j], t_lens[j]
            ids[r, offset : offset + pl + tl] = input_ids[j, width_p - pl : width_p + tl]
            pos[r, offset : offset + pl + tl] = torch.arange(pl + tl)
            token_row[j] = torch.full((tl,), r, dtype=torch.long)
            token_pos[j] = torch.arange(offset + pl - 1, offset + pl + tl - 1)
            offset += pl + tl
        pos[r, offset:] = torch.arange(width - offset)  # the padded tail is a block of its own
    rows_t, pos_t = torch.cat(token_row), torch.cat(token_pos)
    return MicroInputs(
        input_ids=ids.to(device),
        attention_mask=None,
        position_ids=pos.to(device),
        keep=torch.unique(pos_t).to(device),
        labels=ids[rows_t, pos_t + 1].to(device),
        response_mask=response_mask.to(device),
        token_row=rows_t.to(device),
        token_pos=pos_t.to(device),
    )


def _shared_inputs(
    input_ids: torch.Tensor,
    width_p: int,
    p_lens: list[int],
    t_lens: list[int],
    groups: list[int],
    response_mask: torch.Tensor,
    device: torch.device,
) -> MicroInputs:
    """One row ``[prompt | its completions]`` per group piece, pieces back to back (``shared_prompt.py``).

    Rows of one group with the same prompt tokens form a piece, in order of first appearance; a row whose prompt
    differs from its group's (never in practice) starts a piece of its own, so the layout is exact for any batch."""
    pieces: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for j, (g, pl) in enumerate(zip(groups, p_lens, strict=True)):
        prompt = tuple(input_ids[j, width_p - pl : width_p].tolist())
        pieces.setdefault((g, prompt), []).append(j)
    chunks: list[torch.Tensor] = []
    positions: list[torch.Tensor] = []
    token_pos: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * len(p_lens)
    offset = 0
    for (_, prompt), members in pieces.items():
        pl = len(prompt)
        chunks.append(torch.tensor(prompt, dtype=torch.long))
        positions.append(torch.arange(pl))
        last_prompt = offset + pl - 1
        offset += pl
        for j in members:
            tl = t_lens[j]
            chunks.append(input_ids[j, width_p : width_p + tl])
            positions.append(torch.arange(pl, pl + tl))
            # token 0 is predicted by the prompt's last position, token k by the completion's token k - 1
            token_pos[j] = torch.cat([torch.tensor([last_prompt]), torch.arange(offset, offset + tl - 1)])
            offset += tl
    ids = torch.cat(chunks)[None]
    pos_t = torch.cat(token_pos)
    labels = torch.cat([input_ids[j, width_p : width_p + t_lens[j]] for j in range(len(p_lens))])
    layout = build_shared_layout(
        [len(prompt) for _, prompt in pieces], [[t_lens[j] for j in members] for members in pieces.values()]
    )
    return MicroInputs(
        input_ids=ids.to(device),
        attention_mask=torch.ones_like(ids).to(device),
        position_ids=torch.cat(positions)[None].to(device),
        keep=torch.unique(pos_t).to(device),
        labels=labels.to(device),
        response_mask=response_mask.to(device),
        token_row=torch.zeros_like(pos_t).to(device),
        token_pos=pos_t.to(device),
        shared=layout.to(device),
    )


def row_groups(batch: RolloutBatch, layout: Layout) -> list[int] | None:
    """Each row's group where the micro-batches must keep groups together (the shared layout), else None."""
    return batch.index.tolist() if layout == "shared" else None


def to_full_width(values: torch.Tensor, mi: MicroInputs) -> torch.Tensor:
    """Place per-response-token outputs (``[b, t]`` padded or ``[n]`` packed) into a zero ``[b, T]`` matrix."""
    b, width = mi.response_mask.shape
    if mi.packed:
        return values.new_zeros(b, width).masked_scatter(mi.response_mask, values)
    t = values.shape[1]
    if t == width:
        return values
    return torch.cat([values, values.new_zeros(b, width - t)], dim=1)


def _label_rows(mi: MicroInputs) -> torch.Tensor | None:
    """Packed and shared: each response token's row in the flattened ``[R * K, ...]`` kept positions (the model keeps
    ``mi.keep`` in every row); padded: None, the kept ``[b, t]`` positions are the labels' own."""
    if mi.token_row is None:
        return None
    assert mi.token_pos is not None
    return mi.token_row * mi.keep.numel() + torch.searchsorted(mi.keep, mi.token_pos)


def response_logits(model: nn.Module, mi: MicroInputs) -> torch.Tensor:
    """The logits (model dtype) that predict the response tokens, shaped like ``mi.labels``: ``[b, t, V]`` padded,
    ``[n, V]`` packed or shared (one row per response token, micro-batch row-major order)."""
    logits = model(**mi.model_kwargs(), logits_to_keep=mi.keep).logits
    rows = _label_rows(mi)
    if rows is not None:  # packed and shared: [R, K, V] -> one row per response token [n, V]
        logits = logits.reshape(-1, logits.shape[-1])[rows]
    return logits


def response_log_probs(
    model: nn.Module, mi: MicroInputs, *, temperature: float, entropy: str = "none"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[b, T]`` (fp32, zero at padding) of the response tokens under ``model``, and their entropy.

    ``entropy``: ``none`` (returns ``None``), ``detached`` (a metric: computed without grad) or ``grad`` (a loss term).
    Log-probs are differentiable when called under grad. The log-softmax and entropy run in fp32 over row chunks
    (:func:`~async_rl.algorithms.token_log_probs_and_entropy`), so neither pass holds an fp32 copy of all the logits.
    """
    if entropy not in ("none", "detached", "grad"):
        raise ValueError(f"entropy must be 'none', 'detached' or 'grad', got {entropy!r}")
    head = fused_output_layer(model)
    if head is not None:  # use_fused_kernels: the output layer returns the log-probs, no logits are kept
        request = FusedRequest(_label_rows(mi), mi.labels, temperature, entropy)
        with fused_log_probs(head, request):
            out = model(**mi.model_kwargs(), logits_to_keep=mi.keep).logits
        log_probs, ent = out[..., 0], {"none": None, "detached": out[..., 1].detach(), "grad": out[..., 1]}[entropy]
    else:
        logits = response_logits(model, mi)  # model dtype; cast to fp32 a chunk at a time below
        log_probs, ent = token_log_probs_and_entropy(logits, mi.labels, temperature=temperature, entropy=entropy)
    mask = mi.response_mask
    lp = to_full_width(log_probs, mi) * mask
    return lp, None if ent is None else to_full_width(ent, mi) * mask


def response_values(model: nn.Module, mi: MicroInputs) -> torch.Tensor:
    """Critic values ``[b, T]`` (fp32, zero at padding) at the positions that precede each response token.

    ``model`` is a token-classification model with one label (backbone + linear value head).
    """
    out = model(**mi.model_kwargs())
    values = out.logits.float().squeeze(-1)
    if mi.token_row is not None:
        values = values[mi.token_row, mi.token_pos]
    else:
        values = values[:, mi.keep]
    return to_full_width(values, mi) * mi.response_mask


@torch.no_grad()
def forward_full_batch(
    ctx: DistContext,
    batch: RolloutBatch,
    fn: Callable[[MicroInputs], torch.Tensor],
    *,
    micro_size: int,
    layout: Layout,
) -> torch.Tensor:
    """Apply ``fn`` (micro inputs -> ``[b, T]``) to this rank's share of ``batch``; return the gathered ``[B, T]``.

    Shares come from :func:`plan_forward` (equal row counts, balanced tokens), so the all-gather sees equal shapes.
    """
    lengths = (batch.prompt_lengths + batch.response_lengths).tolist()
    groups = row_groups(batch, layout)
    plans = [plan_forward(lengths, ctx.world_size, r, micro_size, groups=groups) for r in range(ctx.world_size)]
    outs = [fn(build_micro_inputs(batch, rows, layout=layout, device=ctx.device)).float() for rows in plans[ctx.rank]]
    local = torch.cat(outs, dim=0)
    gathered = ctx.all_gather(local).cpu()
    order = torch.tensor([i for plan in plans for rows in plan for i in rows], dtype=torch.long)
    full = torch.empty_like(gathered)
    full[order] = gathered
    return full
