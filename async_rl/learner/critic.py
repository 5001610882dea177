"""The value model for GAE: predictions before the actor update and its own clipped value-loss update.

Only built when ``adv_estimator == "gae"``; every critic-free estimator never constructs one. The model is a causal
LM backbone with a one-output linear head (``AutoModelForTokenClassification(num_labels=1)`` or a factory), sharded
like the actor, with its own AdamW/schedule (``critic.optim``) and mini-batch geometry (``critic.ppo_*``). The value
of response token ``t`` is read at the position that precedes it, the state the token was sampled from.
"""

from __future__ import annotations

import torch

from async_rl import metric_catalog as mc
from async_rl.algorithms import value_loss
from async_rl.config.critic import CriticConfig
from async_rl.config.resolve import resolved
from async_rl.learner.batching import RolloutBatch
from async_rl.learner.dist import DistContext
from async_rl.learner.metrics import MetricAccumulator
from async_rl.learner.model import ModelSource, build_model
from async_rl.learner.optim import NonFiniteGuard, build_optimizer
from async_rl.learner.partition import Layout, plan_updates
from async_rl.learner.policy import build_micro_inputs, forward_full_batch, response_values, row_groups
from async_rl.learner.shared_prompt import shared_prompt_enabled
from async_rl.learner.update import TrainedModel, run_updates

__all__ = ["Critic"]


class Critic:
    """Value model + optimizer; ``values`` for GAE, ``update`` after advantages are known."""

    def __init__(
        self,
        cfg: CriticConfig,
        ctx: DistContext,
        source: ModelSource,
        *,
        run_steps: int,
        layout: Layout,
        compute_dtype: torch.dtype,
        gradient_checkpointing: bool,
        max_consecutive_nonfinite: int,
        rollout_n: int,
        micro_forward: int,
        seed: int,
    ) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.layout = layout
        self.rollout_n = rollout_n
        self.micro_forward = micro_forward
        model = build_model(
            source,
            ctx,
            role="critic",
            seed=seed,
            compute_dtype=compute_dtype,
            gradient_checkpointing=gradient_checkpointing,
            head="token_value",
            shared_prompt=layout == "shared",
            reshard_after_forward=cfg.model.fsdp_config.reshard_after_forward,
            fused_output_layer=False,
            min_num_params=cfg.model.fsdp_config.wrap_policy.min_num_params,
        )
        if layout == "shared" and not shared_prompt_enabled(model):
            self.layout = "padded"  # build_model warned: this model computes each prompt per completion
        optimizer, scheduler = build_optimizer(model, cfg.optim, run_steps=run_steps, section="critic.optim")
        self.trained = TrainedModel(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            guard=NonFiniteGuard(max_consecutive_nonfinite),
            max_norm=cfg.grad_clip,
            name="critic",
        )

    @property
    def model(self) -> torch.nn.Module:
        return self.trained.model

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        """Current value predictions ``[B, T]`` for the whole batch (identical on every rank)."""
        return forward_full_batch(
            self.ctx,
            batch,
            lambda mi: response_values(self.model, mi),
            micro_size=self.micro_forward,
            layout=self.layout,
        )

    def update(self, batch: RolloutBatch, acc: MetricAccumulator, seed: int) -> int:
        """Train on ``batch`` (which must hold ``values`` and ``returns``); returns the number of skipped steps."""
        values, returns = batch.values, batch.returns
        if values is None or returns is None:
            raise ValueError("the critic update needs the batch's values and returns")
        c = self.cfg
        lengths = (batch.prompt_lengths + batch.response_lengths).tolist()
        plan = plan_updates(
            lengths,
            mini_size=resolved(c.ppo_mini_batch_size, "critic.ppo_mini_batch_size") * self.rollout_n,
            micro_size=resolved(c.ppo_micro_batch_size_per_gpu, "critic.ppo_micro_batch_size_per_gpu"),
            epochs=resolved(c.ppo_epochs, "critic.ppo_epochs"),
            world_size=self.ctx.world_size,
            rank=self.ctx.rank,
            shuffle=resolved(c.shuffle, "critic.shuffle"),
            seed=seed,
            groups=row_groups(batch, self.layout),
            skip=None,
        )
        device = self.ctx.device

        def micro_loss(rows: list[int], tokens: float, seqs: float) -> torch.Tensor:
            mi = build_micro_inputs(batch, rows, layout=self.layout, device=device)
            idx = torch.as_tensor(rows, dtype=torch.long)
            vpreds = response_values(self.model, mi)
            old = values.index_select(0, idx).to(device)
            target = returns.index_select(0, idx).to(device)
            loss_mask = batch.loss_mask.index_select(0, idx).to(device)
            loss, clipfrac = value_loss(
                vpreds,
                target,
                old,
                loss_mask,
                cliprange_value=c.cliprange_value,
                loss_agg_mode=resolved(c.loss_agg_mode, "critic.loss_agg_mode"),
                global_num_tokens=tokens,
                global_num_seqs=seqs,
                loss_scale_factor=c.loss_scale_factor,
            )
            acc.mean(mc.LEARNER_CRITIC_VF_CLIPFRAC, clipfrac)
            mask = loss_mask.float()
            acc.ratio(mc.LEARNER_CRITIC_VPRED_MEAN, (vpreds.detach() * mask).sum(), mask.sum())
            return loss

        return run_updates(self.ctx, self.trained, plan, batch, micro_loss, acc)
