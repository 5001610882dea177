"""The reward model on the FSDP2 learner: a sequence-score head on a causal-LM trunk, its Bradley-Terry update, scoring.

The model is built by the learner's one builder (:func:`~async_rl.learner.model.build_model`, head
``sequence_score``: ``AutoModelForSequenceClassification(num_labels=1)``, sharded, in the learner's precision), with
the learner's AdamW and schedule (:func:`~async_rl.learner.optim.build_optimizer`) and its guarded step (clip, skip a
non-finite step). A pair's two sequences go through one forward together; the score of a sequence is the head's output
at its last non-pad token (right padding), which is what the exported model computes in plain transformers.

Gradient scaling follows the RL update (:mod:`async_rl.learner.update`): each rank takes every W-th pair of the
step's batch, each micro-batch's loss is a sum over its pairs divided by the step's global pair count, and the loss is
multiplied by the world size before backward because FSDP2 averages gradients over ranks. The step's gradient is
then the gradient of the mean loss over all its pairs, whatever the world size and the micro-batch size.

Checkpoints are the learner's (:func:`~async_rl.learner.checkpoint.save_trained`): the one trained model under the
name ``reward_model``, with the trainer's data cursor as ``extra``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from async_rl import metric_catalog as mc
from async_rl.algorithms import bradley_terry_loss, pair_stats
from async_rl.config.reward_model_train import RewardModelTrainConfig
from async_rl.learner.dist import DistContext
from async_rl.learner.model import ModelSource, build_model
from async_rl.learner.precision import resolve_compute_dtype
from async_rl.learner.supervised import SupervisedModel

__all__ = ["PairScores", "RewardModel", "pad_right"]


def pad_right(seqs: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[N, T]`` (``T`` = the longest), right-padded with ``pad_token_id``."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


class PairScores:
    """Scores ``[P]`` of the chosen and the rejected sequences of P pairs (float64, on the host), and their summary."""

    def __init__(self, chosen: torch.Tensor, rejected: torch.Tensor) -> None:
        self.chosen, self.rejected = chosen, rejected

    def summary(self, margins: torch.Tensor, center_rewards_coefficient: float) -> dict[str, float]:
        """Loss (with margins and centring), pairwise accuracy (ties count half), mean r_c - r_r, reward mean/std."""
        c, r = self.chosen, self.rejected
        loss = bradley_terry_loss(
            c, r, margins, center_rewards_coefficient=center_rewards_coefficient, global_num_pairs=c.numel()
        )
        s = {k: float(v) for k, v in pair_stats(c, r).items()}
        mean = s["reward"] / (2 * s["pairs"])
        return {
            mc.RM_EVAL_LOSS: float(loss),
            mc.RM_EVAL_ACCURACY: s["correct"] / s["pairs"],
            mc.RM_EVAL_MARGIN_MEAN: s["margin"] / s["pairs"],
            mc.RM_EVAL_REWARD_MEAN: mean,
            mc.RM_EVAL_REWARD_STD: math.sqrt(max(0.0, s["reward_sq"] / (2 * s["pairs"]) - mean * mean)),
        }


class RewardModel(SupervisedModel):
    """One rank's reward model: ``train_step`` on a batch of pairs, ``score_pairs`` for evaluation, ``export``."""

    def __init__(
        self, cfg: RewardModelTrainConfig, ctx: DistContext, source: ModelSource, *, run_steps: int, pad_token_id: int
    ) -> None:
        self.cfg, self.ctx, self.pad_token_id = cfg, ctx, pad_token_id
        self.compute_dtype = resolve_compute_dtype(cfg.model.mixed_precision.param_dtype, ctx.device, warn=ctx.is_rank0)
        torch.manual_seed(cfg.trainer.seed)  # the fresh score head: the same on every rank before sharding
        model = build_model(
            source,
            ctx,
            role="reward model",
            seed=cfg.trainer.seed,
            compute_dtype=self.compute_dtype,
            gradient_checkpointing=cfg.model.enable_gradient_checkpointing,
            head="sequence_score",
            pad_token_id=pad_token_id,
            reshard_after_forward=True,  # FSDP2's default: reward_model_train has no fsdp_config section
            shared_prompt=False,  # one scored sequence per row: no groups to share a prompt
            fused_output_layer=False,
            min_num_params=0,  # one unit per decoder layer, verl's default
        )
        config = getattr(model, "config", None)
        if config is not None:  # FSDP2 subclasses the model as FSDP<name>; the export names the HF class
            config.architectures = [type(model).__name__.removeprefix("FSDP")]
            config.pad_token_id = pad_token_id
        self._train(model, cfg.optim, cfg.trainer, run_steps=run_steps, name="reward_model")

    def _scores(self, seqs: Sequence[Sequence[int]]) -> torch.Tensor:
        """Scores ``[N]`` (float32, on the device) of right-padded sequences, in one forward."""
        ids, mask = pad_right(seqs, self.pad_token_id)
        out = self.model(input_ids=ids.to(self.ctx.device), attention_mask=mask.to(self.ctx.device), use_cache=False)
        return out.logits[:, 0].float()

    def train_step(
        self, chosen: Sequence[Sequence[int]], rejected: Sequence[Sequence[int]], margins: Sequence[float]
    ) -> dict[str, float]:
        """One optimizer step on the step's whole batch of pairs (the same lists on every rank); the step's metrics,
        identical on every rank."""
        started = time.monotonic()
        ctx, c = self.ctx, self.cfg
        n = len(chosen)
        if n % ctx.world_size:
            raise ValueError(f"data.train_batch_size={n} pairs must be divisible by the {ctx.world_size} ranks")
        mine = list(range(ctx.rank, n, ctx.world_size))
        micro = c.data.micro_batch_size_per_gpu
        self.model.train()
        sums = torch.zeros(7, dtype=torch.float64)  # loss, correct, margin, reward, reward^2, pairs, tokens
        for start in range(0, len(mine), micro):
            rows = mine[start : start + micro]
            seqs = [chosen[i] for i in rows] + [rejected[i] for i in rows]
            scores = self._scores(seqs)
            sc, sr = scores[: len(rows)], scores[len(rows) :]
            m = torch.tensor([margins[i] for i in rows], dtype=torch.float32, device=scores.device)
            loss = bradley_terry_loss(
                sc, sr, m, center_rewards_coefficient=c.loss.center_rewards_coefficient, global_num_pairs=n
            )
            (loss * ctx.world_size).backward()
            stats = pair_stats(sc.cpu(), sr.cpu())
            sums += torch.stack(
                [
                    loss.detach().double().cpu(),
                    *(stats[k] for k in ("correct", "margin", "reward", "reward_sq", "pairs")),
                    torch.tensor(float(sum(len(s) for s in seqs)), dtype=torch.float64),
                ]
            )
        total = ctx.all_reduce(sums, "sum")
        lr, stepped, norm = self._step(total[0])
        loss_sum, correct, margin, reward, reward_sq, pairs, tokens = total.tolist()
        mean = reward / (2 * pairs)
        elapsed = time.monotonic() - started
        return {
            mc.RM_TRAIN_LOSS: loss_sum,
            mc.RM_TRAIN_ACCURACY: correct / pairs,
            mc.RM_TRAIN_MARGIN_MEAN: margin / pairs,
            mc.RM_TRAIN_REWARD_MEAN: mean,
            mc.RM_TRAIN_REWARD_STD: math.sqrt(max(0.0, reward_sq / (2 * pairs) - mean * mean)),
            mc.RM_TRAIN_GRAD_NORM: norm,
            mc.RM_TRAIN_LR: lr,
            mc.RM_TRAIN_SKIPPED_STEPS: 0.0 if stepped else 1.0,
            mc.RM_PERF_STEP_S: elapsed,
            mc.RM_PERF_TOKENS_PER_S: tokens / max(elapsed, 1e-9),
        }

    @torch.no_grad()
    def score_pairs(self, chosen: Sequence[Sequence[int]], rejected: Sequence[Sequence[int]]) -> PairScores:
        """Scores of every pair (the same lists on every rank), computed in shares over the ranks and gathered, so
        every rank returns all of them in order. Ranks run the same number of forwards (a short share repeats its
        first pair, left out after the gather)."""
        ctx = self.ctx
        n = len(chosen)
        per_rank = -(-n // ctx.world_size)
        mine = [min(ctx.rank + ctx.world_size * k, n - 1) for k in range(per_rank)]
        micro = self.cfg.data.micro_batch_size_per_gpu
        self.model.eval()
        parts = []
        for start in range(0, per_rank, micro):
            rows = mine[start : start + micro]
            scores = self._scores([chosen[i] for i in rows] + [rejected[i] for i in rows])
            parts.append(torch.stack([scores[: len(rows)], scores[len(rows) :]], dim=1).double())
        self.model.train()
        local = torch.cat(parts) if parts else torch.zeros((0, 2), dtype=torch.float64, device=ctx.device)
        gathered = ctx.all_gather(local).cpu()  # [W * per_rank, 2]: rank-major
        order = gathered.reshape(ctx.world_size, per_rank, 2).transpose(0, 1).reshape(-1, 2)[:n]  # pair i = k*W + r
        return PairScores(order[:, 0].contiguous(), order[:, 1].contiguous())
