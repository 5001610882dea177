"""Supervised fine-tuning on the FSDP2 learner: the policy's model, optimizer, packing and log-prob path, with the
negative log-likelihood of the demonstrated tokens as the loss.

The model is built by the learner's one builder (:func:`~async_rl.learner.model.build_model`, a causal LM, sharded,
in the learner's precision, LoRA adapters when ``model.lora_rank`` > 0), with the learner's AdamW and schedule and its
guarded step (clip, skip a non-finite step). A step's rows arrive as the learner's :class:`RolloutBatch` (prompt, then
the response with its loss mask: the assistant's tokens), so each micro-batch goes through the same padding-free
packing and chunked log-softmax as the policy update (:func:`~async_rl.learner.policy.build_micro_inputs`,
:func:`~async_rl.learner.policy.response_log_probs` at temperature 1).

With ``trainer.label_smoothing_factor`` = eps > 0 each token's loss is the cross-entropy against ``(1 - eps) *
one_hot + eps * uniform`` over the tokenizer's ordinary tokens (:func:`~async_rl.algorithms.label_smoothed_nll`, from
the label's log-prob, its logit and the chunked mean logit over those ids: no second softmax).

The loss is the mean over the step's trained tokens, across ranks (:func:`~async_rl.algorithms.sft_loss`): each rank
takes every W-th row, each micro-batch's summed negative log-likelihood is divided by the step's global count of
trained tokens, and multiplied by the world size before backward because FSDP2 averages gradients over ranks. The
step's gradient is then that of the token mean over the whole batch, whatever the world size and micro-batch size.
"""

from __future__ import annotations

import time

import torch

from async_rl import metric_catalog as mc
from async_rl.algorithms import label_smoothed_nll, masked_logit_mean, sft_loss, token_log_probs_and_entropy
from async_rl.config.sft import SFTConfig
from async_rl.learner.batching import RolloutBatch
from async_rl.learner.dist import DistContext
from async_rl.learner.model import ModelSource, build_model
from async_rl.learner.policy import build_micro_inputs, response_log_probs, response_logits, to_full_width
from async_rl.learner.precision import resolve_compute_dtype
from async_rl.learner.supervised import SupervisedModel
from async_rl.peft_format import LoRASpec

__all__ = ["SFTModel"]


def _loss_mask(batch: RolloutBatch, rows: list[int], like: torch.Tensor) -> torch.Tensor:
    """The rows' loss mask cut to ``like``'s width ``[b, T]``, in its dtype and on its device."""
    return batch.loss_mask.index_select(0, torch.as_tensor(rows))[:, : like.shape[1]].to(like)


class SFTModel(SupervisedModel):
    """One rank's model under SFT: ``train_step`` on a batch, ``nll`` for validation, checkpoints, ``export``."""

    def __init__(
        self, cfg: SFTConfig, ctx: DistContext, source: ModelSource, *, run_steps: int, smooth_ids: list[int]
    ) -> None:
        """``smooth_ids``: the token ids label smoothing spreads its mass over (the tokenizer's ordinary tokens)."""
        self.cfg, self.ctx = cfg, ctx
        self.smooth_ids = smooth_ids
        self._smooth_mask: torch.Tensor | None = None
        m = cfg.model
        self.compute_dtype = resolve_compute_dtype(m.mixed_precision.param_dtype, ctx.device, warn=ctx.is_rank0)
        lora = None
        if m.lora_rank > 0:
            targets = m.target_modules
            lora = LoRASpec(
                rank=m.lora_rank,
                alpha=float(m.lora_alpha),
                target_modules=targets if isinstance(targets, str) else tuple(targets),
                exclude_modules=(),
            )
        model = build_model(
            source,
            ctx,
            role="sft model",
            seed=cfg.trainer.seed,
            compute_dtype=self.compute_dtype,
            gradient_checkpointing=m.enable_gradient_checkpointing,
            lora=lora,
            reshard_after_forward=True,  # FSDP2's default: the SFT config has no fsdp_config section
            shared_prompt=False,  # one supervised sequence per row: no groups to share a prompt
            fused_output_layer=False,
            min_num_params=0,  # one unit per decoder layer, verl's default
        )
        self._train(model, cfg.optim, cfg.trainer, run_steps=run_steps, name="sft")

    def _log_probs(self, batch: RolloutBatch, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs ``[b, T]`` of the rows' response tokens (packed), and their loss mask on the same device."""
        mi = build_micro_inputs(batch, rows, layout="packed", device=self.ctx.device)
        log_probs, _ = response_log_probs(self.model, mi, temperature=1.0)
        return log_probs, _loss_mask(batch, rows, log_probs)

    def _token_nll(self, batch: RolloutBatch, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The training loss of each of the rows' response tokens ``[b, T]`` (the NLL, label-smoothed when
        ``trainer.label_smoothing_factor`` > 0), and their loss mask on the same device."""
        eps = self.cfg.trainer.label_smoothing_factor
        if eps == 0.0:
            log_probs, mask = self._log_probs(batch, rows)
            return -log_probs, mask
        mi = build_micro_inputs(batch, rows, layout="packed", device=self.ctx.device)
        logits = response_logits(self.model, mi)
        log_probs, _ = token_log_probs_and_entropy(logits, mi.labels, temperature=1.0)
        label_logits = logits.gather(-1, mi.labels.long().unsqueeze(-1)).squeeze(-1).to(log_probs.dtype)
        smooth_mean = masked_logit_mean(logits, self._smoothing_mask(logits.shape[-1], logits.device))
        nll = label_smoothed_nll(log_probs, label_logits, smooth_mean, label_smoothing=eps)
        nll = to_full_width(nll, mi) * mi.response_mask
        return nll, _loss_mask(batch, rows, nll)

    def _smoothing_mask(self, vocab: int, device: torch.device) -> torch.Tensor:
        """``[vocab]`` bool: true on ``smooth_ids`` (ids past the model's vocabulary are dropped)."""
        if self._smooth_mask is None or self._smooth_mask.shape[0] != vocab:
            mask = torch.zeros(vocab, dtype=torch.bool)
            ids = torch.as_tensor([i for i in self.smooth_ids if i < vocab], dtype=torch.long)
            mask[ids] = True
            self._smooth_mask = mask.to(device)
        return self._smooth_mask

    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """One optimizer step on the step's whole batch (the same rows on every rank); its metrics, identical on
        every rank."""
        started = time.monotonic()
        ctx = self.ctx
        n = len(batch)
        if n % ctx.world_size:
            raise ValueError(f"data.train_batch_size={n} rows must be divisible by the {ctx.world_size} ranks")
        mine = list(range(ctx.rank, n, ctx.world_size))
        micro = self.cfg.data.micro_batch_size_per_gpu
        global_tokens = float(batch.loss_mask.sum())
        self.model.train()
        sums = torch.zeros(3, dtype=torch.float64)  # loss, trained tokens, all tokens
        for start in range(0, len(mine), micro):
            rows = mine[start : start + micro]
            token_nll, mask = self._token_nll(batch, rows)
            loss = sft_loss(token_nll, mask, global_num_tokens=global_tokens)
            (loss * ctx.world_size).backward()
            trained = float(mask.sum())
            idx = torch.as_tensor(rows)
            seen = float((batch.prompt_lengths[idx] + batch.response_lengths[idx]).sum())
            sums += torch.tensor([float(loss.detach()), trained, seen], dtype=torch.float64)
        total = ctx.all_reduce(sums, "sum")
        lr, stepped, norm = self._step(total[0])
        loss_mean, trained_tokens, tokens = total.tolist()
        elapsed = time.monotonic() - started
        return {
            mc.SFT_TRAIN_LOSS: loss_mean,
            mc.SFT_TRAIN_TRAINED_TOKENS: trained_tokens,
            mc.SFT_TRAIN_GRAD_NORM: norm,
            mc.SFT_TRAIN_LR: lr,
            mc.SFT_TRAIN_SKIPPED_STEPS: 0.0 if stepped else 1.0,
            mc.SFT_PERF_STEP_S: elapsed,
            mc.SFT_PERF_TOKENS_PER_S: tokens / max(elapsed, 1e-9),
        }

    @torch.no_grad()
    def nll(self, batch: RolloutBatch) -> tuple[float, float]:
        """(summed negative log-likelihood of the trained tokens, their count) over the whole batch, every rank
        taking a share. Ranks run the same number of forwards (FSDP2's are collective): a short share repeats its
        first row, with weight 0."""
        ctx = self.ctx
        n = len(batch)
        per_rank = -(-n // ctx.world_size)
        micro = self.cfg.data.micro_batch_size_per_gpu
        self.model.eval()
        sums = torch.zeros(2, dtype=torch.float64)
        for start in range(0, per_rank, micro):
            ks = range(start, min(start + micro, per_rank))
            rows = [min(ctx.rank + ctx.world_size * k, n - 1) for k in ks]
            real = torch.tensor([float(ctx.rank + ctx.world_size * k < n) for k in ks])
            log_probs, mask = self._log_probs(batch, rows)
            mask = mask * real.to(mask)[:, None]
            sums += torch.stack([-(log_probs * mask).sum(), mask.sum()]).double().cpu()
        self.model.train()
        total = ctx.all_reduce(sums, "sum")
        return float(total[0]), float(total[1])
