"""The learner: one ``train_step`` turns a batch of rollout groups into one new policy version.

Per step, on every rank with the same batch (rank 0 collates the groups it pulled and broadcasts the tensors, see
:mod:`async_rl.runtime.rollout_source`; :meth:`Learner.train_step` collates in-process groups itself):

1. the padded tensors: every rank holds the whole batch; a group with a token id outside the vocabulary is
   dropped from the update (``learner/batch/invalid_groups``) instead of crashing the embedding;
2. no-grad passes, each rank on its balanced share, all-gathered to ``[B, T]`` everywhere: the *proximal*
   ``old_log_probs`` under the current weights, reference log-probs (only for a KL term), critic values (GAE only);
   then verl's rollout correction on the whole batch: rejection sampling (``rollout_rs``) zeroes ``loss_mask`` and
   the importance weights pi_old / pi_rollout (``rollout_is``, optionally batch-normalised) are stored for the loss.
   In ``bypass_mode`` there is no proximal pass: the actor's log-probs are the old policy;
3. rewards (minus the KL penalty when ``use_kl_in_reward``) and advantages from the *whole* batch, identically on
   every rank (group statistics need whole groups); with ``mask_truncated_responses`` the rows that ran into the
   length limit then leave ``loss_mask``, which every loss, denominator and count reads (``response_mask`` only
   shapes the forward passes). A multi-turn episode's observation tokens are never in ``loss_mask`` (collation),
   so they get no loss and no count, and GAE bootstraps each sampled token from the next sampled one;
4. critic update (GAE only), then the actor update: ``ppo_epochs`` x mini-batches, each one optimizer step from
   accumulated micro-batch gradients (see ``update.py`` for the scaling), guarded against non-finite values;
5. metrics reduced over ranks, namespaced ``learner/...``; ``version`` increments.

On-policy distillation (``distillation.enabled``) adds one term to the actor's loss from the teacher's log-probs
(``teacher_log_probs``, see :mod:`async_rl.algorithms.distillation`): sent by the actors with each completion
(``teacher_model.placement: actor``), or computed in step 2 by a frozen teacher beside the reference (``learner``).

When the step is a single optimizer step (``ppo_epochs`` 1, one mini-batch) and no KL enters the reward, the
proximal pass of step 2 is skipped: the proximal policy *is* the current weights, so ``old_log_probs`` equal the
update pass's own log-probs, detached (ratio exactly 1, the same loss and gradient as with a separate pass). That
removes one forward over the batch (about a quarter of the step). The off-policy metrics and importance weights are
then computed per micro-batch instead (``learner/actor/proximal_pass_skipped`` = 1). Batch-level corrections
(rejection sampling, batch-normalised weights) keep the pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from async_rl import metric_catalog as mc
from async_rl.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_in_reward,
    compute_advantages,
    rejection_mask,
)
from async_rl.algorithms.objective import ActorMicroBatch, actor_objective, correction_weights
from async_rl.config import Config
from async_rl.config.algorithm import AlgorithmConfig
from async_rl.config.distillation import teacher_at
from async_rl.config.names import needs_critic
from async_rl.config.precision import checkpoint_interval
from async_rl.config.resolve import LearnerStart, resolved
from async_rl.learner.batching import RolloutBatch, collate_groups, mask_out_of_vocab, mask_truncated
from async_rl.learner.checkpoint import load_learner, save_learner
from async_rl.learner.critic import Critic
from async_rl.learner.dist import DistContext, log_rank0
from async_rl.learner.export import clean_name, full_state_manifest, iter_full_state
from async_rl.learner.lora import adapters_disabled, lora_modules, lora_spec
from async_rl.learner.metrics import MetricAccumulator
from async_rl.learner.model import ModelSource, build_model
from async_rl.learner.objective_spec import objective_spec
from async_rl.learner.optim import NonFiniteGuard, build_optimizer
from async_rl.learner.partition import Layout, UpdatePlan, padding_waste, plan_updates
from async_rl.learner.policy import build_micro_inputs, forward_full_batch, response_log_probs, row_groups
from async_rl.learner.precision import resolve_compute_dtype
from async_rl.learner.shared_prompt import shared_prompt_enabled
from async_rl.learner.step_size import measure_step_size
from async_rl.learner.update import TrainedModel, run_updates
from async_rl.metric_catalog import histogram_mean, lag_histogram
from async_rl.peft_format import adapter_config, peft_name
from async_rl.transport.protocol import AdapterPlan, RolloutGroup
from async_rl.weight_sync.protocol import TensorSpec

__all__ = ["Learner"]

logger = logging.getLogger(__name__)

_EXTREME_SUFFIXES = {"_max": "max", "_min": "min"}


class Learner:
    """Actor (+ optional reference and critic) on an FSDP2 group; see the module docstring for the step."""

    def __init__(
        self,
        cfg: Config,
        start: LearnerStart,
        ctx: DistContext,
        policy: ModelSource,
        *,
        ref: ModelSource | None = None,
        critic: ModelSource | None = None,
        teacher: ModelSource | None = None,
    ) -> None:
        """``cfg``: a validated config, whose sections the learner keeps and reads; ``start``: what the config
        cannot say (:func:`async_rl.config.resolve.learner_start`). ``critic``: the value model (GAE only; by
        default ``critic.model.path``). ``teacher``: on-policy distillation's teacher, required with
        ``distillation.teacher_model.placement: learner`` (frozen, like the reference)."""
        self.ctx = ctx
        self.start = start
        arr = cfg.actor_rollout_ref
        self.actor_cfg = arr.actor
        self.ref_fsdp = arr.ref.fsdp_config  # the reference's and a learner-side teacher's
        self.rollout_cfg = arr.rollout
        self.model_cfg = arr.model
        self.algo = cfg.algorithm
        self.data_cfg = cfg.data
        self.seed = cfg.trainer.seed
        self.objective = objective_spec(arr.actor, cfg.algorithm.rollout_correction, cfg.distillation)
        self.lora = lora_spec(arr.model)
        # only a KL term reads reference log-probs
        self.needs_ref = arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        self.micro_forward = resolved(
            arr.rollout.log_prob_micro_batch_size_per_gpu, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
        )
        # param_dtype resolved once for this device; the actor, the reference and the critic all compute in it
        self.compute_dtype = resolve_compute_dtype(
            arr.actor.fsdp_config.mixed_precision.param_dtype, ctx.device, warn=ctx.is_rank0
        )
        self.actor = self._build_actor(policy, start)
        self.vocab_size = embedding_rows(self.actor.model)
        # with LoRA the reference policy is the actor's frozen base (adapters off): no second copy of the model
        self.ref = self._build_ref(ref if ref is not None else policy) if self.needs_ref and self.lora is None else None
        self.teacher = self._teacher(cfg, teacher)
        self.critic: Critic | None = None
        if needs_critic(cfg.algorithm.adv_estimator):
            source = critic if critic is not None else (cfg.critic.model.path or None)
            if source is None:
                raise ValueError("adv_estimator 'gae' needs a critic model: pass critic= or set critic.model.path")
            self.critic = Critic(
                cfg.critic,
                ctx,
                source,
                run_steps=start.total_training_steps,
                layout=self.layout,
                compute_dtype=self.compute_dtype,
                gradient_checkpointing=arr.model.enable_gradient_checkpointing,
                max_consecutive_nonfinite=arr.actor.max_consecutive_nonfinite,
                rollout_n=arr.rollout.n,
                micro_forward=self.micro_forward,
                seed=self.seed,
            )
        self.kl_ctrl = kl_controller(cfg.algorithm)
        self.version = 0
        self.loss_hook: Callable[[torch.Tensor], torch.Tensor] | None = None  # tests: corrupt the loss on purpose

    def _checkpoint_interval(self) -> int:
        """The policy's activation-checkpointing interval (``model.gradient_checkpointing_interval``, ``auto`` by the
        compute dtype), logged once."""
        learner = "bf16" if self.compute_dtype == torch.bfloat16 else "fp32"
        interval, why = checkpoint_interval(self.model_cfg.gradient_checkpointing_interval, learner)
        log_rank0(self.ctx, logger, "actor: activation checkpointing every %d decoder layer(s) (%s)", interval, why)
        return interval

    def _build_actor(self, policy: ModelSource, start: LearnerStart) -> TrainedModel:
        """The policy with its optimizer; also settles ``self.layout``, the micro-batch layout every pass uses
        (shared prompts need a model that takes them: build_model warns, and the layout falls back)."""
        model_cfg, actor_cfg = self.model_cfg, self.actor_cfg
        actor = build_model(
            policy,
            self.ctx,
            role="actor",
            compute_dtype=self.compute_dtype,
            gradient_checkpointing=self._checkpoint_interval() if model_cfg.enable_gradient_checkpointing else 0,
            lora=self.lora,
            seed=self.seed,
            shared_prompt=model_cfg.use_shared_prompt,
            fused_output_layer=model_cfg.use_fused_kernels,
            reshard_after_forward=actor_cfg.fsdp_config.reshard_after_forward,
            min_num_params=actor_cfg.fsdp_config.wrap_policy.min_num_params,
        )
        packed_or_padded: Layout = "packed" if model_cfg.use_remove_padding else "padded"
        self.layout: Layout = "shared" if model_cfg.use_shared_prompt else packed_or_padded
        if self.layout == "shared" and not shared_prompt_enabled(actor):
            self.layout = packed_or_padded
        optimizer, scheduler = build_optimizer(
            actor, actor_cfg.optim, run_steps=start.total_training_steps, section="actor_rollout_ref.actor.optim"
        )
        guard = NonFiniteGuard(actor_cfg.max_consecutive_nonfinite)
        return TrainedModel(actor, optimizer, scheduler, guard, actor_cfg.grad_clip, "actor")

    def _teacher(self, cfg: Config, source: ModelSource | None) -> torch.nn.Module | None:
        """Distillation's teacher when the learner computes it (``placement: learner``), else None."""
        if not teacher_at(cfg.distillation, "learner"):
            return None
        if source is None:
            raise ValueError("distillation.teacher_model.placement=learner: the learner needs the teacher (teacher=)")
        return self._build_ref(source, role="teacher")

    def _build_ref(self, source: ModelSource, role: str = "ref") -> torch.nn.Module:
        """A frozen model (the reference policy, or the distillation teacher), in the actor's precision and layout."""
        ref = build_model(
            source,
            self.ctx,
            role=role,
            seed=self.seed,
            trainable=False,
            compute_dtype=self.compute_dtype,
            shared_prompt=self.layout == "shared",
            gradient_checkpointing=0,  # forward only, without gradients: nothing to recompute
            fused_output_layer=self.model_cfg.use_fused_kernels,
            reshard_after_forward=self.ref_fsdp.reshard_after_forward,
            min_num_params=self.ref_fsdp.wrap_policy.min_num_params,
        )
        if self.layout == "shared" and not shared_prompt_enabled(ref):
            raise ValueError(
                f"the {role} model cannot compute shared prompts while the policy does: use models of one"
                " family, or set actor_rollout_ref.model.use_shared_prompt=false"
            )
        return ref

    @property
    def model(self) -> torch.nn.Module:
        return self.actor.model

    def iter_weights(self, *, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        """Full actor weights one tensor at a time, on rank 0 (every rank must exhaust it): weight-sync input.
        With LoRA only the adapter, under PEFT's names (what vLLM loads as an adapter)."""
        return iter_full_state(self.model, self.ctx, dtype=dtype, rename=self._sync_name)

    def weight_manifest(self, *, dtype: torch.dtype | None) -> list[TensorSpec]:
        """What :meth:`iter_weights` yields, from metadata alone (the weight sync plans its buckets from it)."""
        return full_state_manifest(self.model, dtype=dtype, rename=self._sync_name)

    @property
    def _sync_name(self) -> Callable[[str], str | None] | None:
        return peft_name if self.lora is not None else None

    def probe_log_probs(self, token_ids: Sequence[int]) -> list[float]:
        """log p(token_ids[i + 1] | token_ids[: i + 1]) under the current weights, at temperature 1 (every rank calls
        it: the forward is collective under FSDP2). What a served-weights check compares an actor with."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.ctx.device)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                logits = self.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        finally:
            self.model.train(was_training)
        logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        return [float(v) for v in logp.cpu()]

    def adapter_plan(self) -> AdapterPlan | None:
        """What a weight update carries in a LoRA run (None: the full weights), for the weight-sync plan."""
        config = self.adapter_config()
        if config is None:
            return None
        return AdapterPlan(
            rank=int(config["r"]), alpha=float(config["lora_alpha"]), target_modules=tuple(config["target_modules"])
        )

    def adapter_config(self, base_model: str = "") -> dict[str, Any] | None:
        """The PEFT ``adapter_config.json`` of the trained adapter; None without LoRA."""
        spec = self.lora
        if spec is None:
            return None
        return adapter_config(spec, [clean_name(n) for n, _ in lora_modules(self.model)], base_model=base_model)

    def save_checkpoint(self, root: str | Path, *, extra: bytes | dict[str, Any] | None, keep_last: int | None) -> Path:
        """See :func:`async_rl.learner.checkpoint.save_learner` (every rank calls it)."""
        return save_learner(self, root, extra=extra, keep_last=keep_last)

    def load_checkpoint(self, path: str | Path) -> bytes | dict[str, Any] | None:
        """See :func:`async_rl.learner.checkpoint.load_learner`; returns the saved ``extra`` state."""
        return load_learner(self, path)

    # ------------------------------------------------------------------ passes
    def _log_probs(self, model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
        """Log-probs of every response token under ``model``, at the rollout's temperature."""
        return self._log_probs_at(model, batch, self.rollout_cfg.temperature)

    def _log_probs_at(self, model: torch.nn.Module, batch: RolloutBatch, temperature: float) -> torch.Tensor:
        return forward_full_batch(
            self.ctx,
            batch,
            lambda mi: response_log_probs(model, mi, temperature=temperature)[0],
            micro_size=self.micro_forward,
            layout=self.layout,
        )

    def _rewards_and_advantages(self, batch: RolloutBatch, acc: dict[str, float]) -> None:
        algo = self.algo
        mask = batch.loss_mask
        rewards = batch.token_level_scores
        if self.kl_ctrl is not None:
            old, ref = batch.old_log_probs, batch.ref_log_probs
            assert old is not None and ref is not None, "a KL in the reward runs the proximal and reference passes"
            rewards, kl_metrics = apply_kl_in_reward(rewards, old, ref, mask, self.kl_ctrl, algo.kl_penalty)
            acc.update({mc.learner_key(k): float(v) for k, v in kl_metrics.items()})
        batch.token_level_rewards = rewards
        advantages, returns = compute_advantages(
            algo.adv_estimator,
            token_level_rewards=rewards,
            response_mask=mask,
            index=batch.index,
            values=batch.values,
            gamma=algo.gamma,
            lam=algo.lam,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        )
        batch.advantages = advantages
        batch.returns = returns

    def _rollout_correction(self, batch: RolloutBatch, out: dict[str, float]) -> None:
        """Decoupled mode, once per step on the whole batch (as verl's trainer does, before advantages): rejection
        sampling zeroes ``loss_mask`` where pi_old / pi_rollout is out of bounds, and the IS weights (normalised to
        mean 1 over the batch with ``rollout_is_batch_normalize``) are stored as ``is_weights`` for every micro-batch.
        Every rank holds the whole batch, so the batch means need no collective."""
        spec = self.objective
        old, behaviour = batch.old_log_probs, batch.rollout_log_probs
        assert old is not None, "the proximal pass runs first"
        if spec.rs_bounds is not None:
            kept, rs_metrics = rejection_mask(old, behaviour, batch.loss_mask, bounds=spec.rs_bounds)
            batch.loss_mask = kept
            out.update({mc.learner_rollout_corr_key(k): float(v) for k, v in rs_metrics.items()})
        if spec.rollout_is is None:
            return
        weights, is_metrics = correction_weights(old, behaviour, batch.loss_mask, spec)
        batch.is_weights = weights
        out.update({mc.learner_rollout_corr_key(k): float(v) for k, v in is_metrics.items()})

    # ------------------------------------------------------------------ actor update
    def _reuses_proximal(self, batch_size: int) -> bool:
        """One optimizer step from the current weights, nothing needs old log-probs first: skip the proximal pass.

        Not with batch-level corrections (rejection sampling, batch-normalised weights: they change the loss
        denominators or need the whole batch first), nor in bypass mode, which has no proximal policy at all."""
        spec, actor = self.objective, self.actor_cfg
        batch_level = spec.rs_bounds is not None or (spec.rollout_is is not None and spec.is_batch_normalize)
        one_step = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size * self.rollout_cfg.n >= batch_size
        return one_step and self.kl_ctrl is None and not batch_level and spec.bypass_loss_type is None

    def _actor_micro_loss(
        self,
        batch: RolloutBatch,
        acc: MetricAccumulator,
        reuse_proximal: bool = False,
        capture: torch.Tensor | None = None,
    ) -> Callable[..., torch.Tensor]:
        """The actor's micro-batch loss; ``capture`` ``[B, T]``, when given, receives each computed row's log-probs
        (the policy before the step, when the step makes one optimizer update)."""
        spec, temperature = self.objective, self.rollout_cfg.temperature
        device = self.ctx.device

        def micro_loss(rows: list[int], tokens: float, seqs: float) -> torch.Tensor:
            mi = build_micro_inputs(batch, rows, layout=self.layout, device=device)
            idx = torch.as_tensor(rows, dtype=torch.long)

            def sel(tensor: torch.Tensor | None) -> torch.Tensor:
                assert tensor is not None, "the step computes it before the update"
                return tensor.index_select(0, idx).to(device)

            mode = "grad" if spec.entropy_coeff != 0 else "detached"
            log_prob, entropy = response_log_probs(self.model, mi, temperature=temperature, entropy=mode)
            assert entropy is not None
            if capture is not None:
                capture.index_copy_(0, idx.to(capture.device), log_prob.detach().to(capture))
            if reuse_proximal:
                old_log_prob = log_prob.detach()
                _accumulate_offpolicy(acc, old_log_prob, sel(batch.rollout_log_probs), sel(batch.sampled_mask))
            else:
                old_log_prob = sel(batch.old_log_probs)
            out = actor_objective(
                ActorMicroBatch(
                    log_prob=log_prob,
                    entropy=entropy,
                    old_log_prob=old_log_prob,
                    rollout_log_prob=sel(batch.rollout_log_probs),
                    advantages=sel(batch.advantages),
                    loss_mask=sel(batch.loss_mask).bool(),
                    # the step's weights (decoupled, after the proximal pass); else the objective computes them
                    is_weights=sel(batch.is_weights) if batch.is_weights is not None else None,
                    ref_log_prob=sel(batch.ref_log_probs) if spec.kl_loss_coef is not None else None,
                    global_num_tokens=tokens,
                    global_num_seqs=seqs,
                    teacher_log_prob=sel(batch.teacher_log_probs) if spec.distill is not None else None,
                ),
                spec,
            )
            loss = out.loss
            if out.kl_loss is not None:
                acc.total("_kl_loss_sum", out.kl_loss)
            if self.loss_hook is not None:
                loss = self.loss_hook(loss)
            fmask = out.mask.float()
            acc.ratio(mc.LEARNER_ACTOR_ENTROPY, (entropy.detach() * fmask).sum(), fmask.sum())
            acc.total("_pg_loss_sum", out.pg_loss)
            for key_of, values in (
                (mc.learner_actor_key, out.policy_metrics),
                (mc.learner_rollout_corr_key, out.correction_metrics),
                (mc.learner_distillation_key, out.distill_metrics),
            ):
                for key, value in values.items():
                    kind = next((k for suf, k in _EXTREME_SUFFIXES.items() if key.endswith(suf)), "mean")
                    getattr(acc, kind)(key_of(key), value)
            return loss

        return micro_loss

    # ------------------------------------------------------------------ the step
    def train_step(self, groups: Sequence[RolloutGroup], prompts: Mapping[int, Sequence[int]]) -> dict[str, float]:
        """One policy version from ``groups`` and their prompts' tokens by ``prompt_id`` (the same on every rank):
        collate, then :meth:`train_batch`. A training run collates once on rank 0 and broadcasts the tensors instead
        (:mod:`async_rl.runtime.rollout_source`)."""
        return self.train_batch(self.collate(groups, prompts), [g.prompt_id for g in groups])

    def collate(self, groups: Sequence[RolloutGroup], prompts: Mapping[int, Sequence[int]]) -> RolloutBatch:
        """``groups`` -> this learner's padded batch (its pad id and length limits; see :func:`collate_groups`)."""
        return collate_groups(
            groups,
            prompts,
            pad_token_id=self.start.pad_token_id,
            max_prompt_length=self.data_cfg.max_prompt_length,
            max_response_length=self.data_cfg.max_response_length,
        )

    def train_batch(self, batch: RolloutBatch, group_ids: Sequence[Any]) -> dict[str, float]:
        """One policy version from a collated ``batch`` (the same on every rank; ``group_ids[i]`` names dense group
        ``i`` in log lines). Returns ``learner/...`` metrics."""
        t_start = time.perf_counter()
        out: dict[str, float] = {}
        reuse = self._prepare_batch(batch, group_ids, out)
        t_update = time.perf_counter()
        acc = MetricAccumulator()
        seed = self.seed * 1_000_003 + self.version
        skipped_critic = self.critic.update(batch, acc, seed) if self.critic is not None else 0
        plan = self._plan_updates(batch, seed)
        before, capture = self._before_step(batch, plan, reuse) if self._measures_step_size() else (None, None)
        micro_loss = self._actor_micro_loss(batch, acc, reuse, capture)
        skipped = run_updates(self.ctx, self.actor, plan, batch, micro_loss, acc)
        if before is not None:
            measure_step_size(
                self.model,
                batch,
                plan,
                before,
                acc,
                layout=self.layout,
                device=self.ctx.device,
                temperature=self.rollout_cfg.temperature,
            )
        offpolicy, computed, total_slots = self._reduce_update_metrics(batch, plan, acc, out)
        t_end = time.perf_counter()
        out.update(self._batch_metrics(batch, offpolicy if reuse else None))
        out[mc.LEARNER_ACTOR_PROXIMAL_PASS_SKIPPED] = float(reuse or self.objective.bypass_loss_type is not None)
        self.version += 1
        out.update(
            {
                mc.LEARNER_BATCH_PADDING_WASTE: 1.0 - computed / total_slots if total_slots else 0.0,
                mc.LEARNER_BATCH_TOKENS_COMPUTED: total_slots,
                mc.LEARNER_BATCH_SKIPPED_SEQUENCES: float(plan.left_out),
                mc.LEARNER_BATCH_TOKEN_IMBALANCE: plan.imbalance,
                mc.LEARNER_ACTOR_SKIPPED_UPDATES: float(skipped),
                mc.LEARNER_ACTOR_SKIPPED_TOTAL: float(self.actor.guard.skipped_total),
                mc.LEARNER_PERF_STEP_TIME_S: t_end - t_start,
                mc.LEARNER_PERF_UPDATE_TIME_S: t_end - t_update,
                mc.LEARNER_PERF_TOKENS_PER_S: float(batch.attention_mask.sum()) / max(t_end - t_start, 1e-9),
                mc.LEARNER_PERF_UPDATE_TOKENS_PER_S: computed / max(t_end - t_update, 1e-9),
                mc.LEARNER_VERSION: float(self.version),
            }
        )
        if self.critic is not None:
            out[mc.LEARNER_CRITIC_SKIPPED_UPDATES] = float(skipped_critic)
        log_rank0(self.ctx, logger, "step -> version %d: %s", self.version, _brief(out))
        return out

    def _prepare_batch(self, batch: RolloutBatch, group_ids: Sequence[Any], out: dict[str, float]) -> bool:
        """Everything before the updates: out-of-vocabulary groups masked out, the no-grad passes (proximal,
        reference, teacher, critic values), rewards and advantages, truncated responses masked. Returns whether the
        update reuses its own first forward as the proximal policy (the proximal pass skipped)."""
        ctx, spec = self.ctx, self.objective
        # the tokens the model sampled, before any leaves the loss: behaviour log-probs exist only there (an
        # observation token's is 0), so the off-policy metrics compare the policies over them
        batch.sampled_mask = batch.loss_mask != 0
        invalid = (
            mask_out_of_vocab(batch, self.vocab_size, self.start.pad_token_id) if self.vocab_size is not None else []
        )
        if invalid:
            bad = [group_ids[i] for i in invalid]
            what = "dropped %d group(s) with token ids outside the vocabulary of %d: %s"
            log_rank0(ctx, logger, what, len(bad), self.vocab_size, bad, level=logging.ERROR)
        out[mc.LEARNER_BATCH_INVALID_GROUPS] = float(len(invalid))
        self.model.eval()  # no-grad passes: HF checkpointing stays off, dropout is already 0
        reuse = self._reuses_proximal(len(batch))
        if spec.bypass_loss_type is not None:
            batch.old_log_probs = batch.rollout_log_probs
        elif not reuse:
            batch.old_log_probs = self._log_probs(self.model, batch)
            self._rollout_correction(batch, out)
        if self.ref is not None:
            batch.ref_log_probs = self._log_probs(self.ref, batch)
        elif self.needs_ref:
            with adapters_disabled(self.model):
                batch.ref_log_probs = self._log_probs(self.model, batch)
        if self.teacher is not None:  # at temperature 1, as a teacher engine on the actors scores
            batch.teacher_log_probs = self._log_probs_at(self.teacher, batch, 1.0)
        if spec.distill is not None and batch.teacher_log_probs is None:
            raise ValueError("distillation.enabled=true, but the batch carries no teacher log-probs")
        if self.critic is not None:
            batch.values = self.critic.values(batch)
        self.model.train()
        self._rewards_and_advantages(batch, out)
        truncated = mask_truncated(batch) if self.actor_cfg.mask_truncated_responses else 0
        out[mc.LEARNER_BATCH_TRUNCATED_MASKED] = float(truncated)
        return reuse

    def _measures_step_size(self) -> bool:
        """Whether this step measures its size (``actor.step_kl_freq``: the first step and every N-th after it)."""
        freq = self.actor_cfg.step_kl_freq
        return freq > 0 and self.version % freq == 0

    def _before_step(
        self, batch: RolloutBatch, plan: UpdatePlan, reuse: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs ``[B, T]`` of the policy before the step, and the buffer the update's forward must fill (or
        None): the proximal pass's where it ran; else, with one update, an empty buffer that its forward fills; else
        (several updates and no proximal pass: bypass mode) a pass of its own."""
        if not reuse and self.objective.bypass_loss_type is None:
            assert batch.old_log_probs is not None, "the proximal pass ran"
            return batch.old_log_probs, None
        if plan.num_updates == 1:
            buffer = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=self.ctx.device)
            return buffer, buffer
        self.model.eval()
        before = self._log_probs(self.model, batch)
        self.model.train()
        return before, None

    def _plan_updates(self, batch: RolloutBatch, seed: int) -> UpdatePlan:
        """This rank's mini- and micro-batches of ``batch`` for every epoch (``ppo_mini_batch_size`` counts prompts)."""
        actor_cfg = self.actor_cfg
        micro_key = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
        return plan_updates(
            (batch.prompt_lengths + batch.response_lengths).tolist(),
            mini_size=actor_cfg.ppo_mini_batch_size * self.rollout_cfg.n,
            micro_size=resolved(actor_cfg.ppo_micro_batch_size_per_gpu, micro_key),
            epochs=actor_cfg.ppo_epochs,
            world_size=self.ctx.world_size,
            rank=self.ctx.rank,
            shuffle=actor_cfg.shuffle,
            seed=seed,
            groups=row_groups(batch, self.layout),
            skip=self._zero_advantage_rows(batch) if actor_cfg.skip_zero_advantage else None,
        )

    def _zero_advantage_rows(self, batch: RolloutBatch) -> list[bool] | None:
        """Each row, whether all its advantages are exactly zero, where such a row's loss and gradient are exactly
        zero (``actor.skip_zero_advantage``); None where the objective has a term that does not vanish with the
        advantage or couples rows: an entropy bonus, a KL loss, distillation, batch-normalised importance weights,
        rejection sampling."""
        spec = self.objective
        if (
            spec.entropy_coeff != 0
            or spec.kl_loss_coef is not None
            or spec.distill is not None
            or spec.is_batch_normalize
            or spec.rs_bounds is not None
        ):
            return None
        assert batch.advantages is not None, "the step computes them first"
        zero = (batch.advantages == 0) | (batch.loss_mask == 0)
        return zero.all(dim=-1).tolist()

    def _reduce_update_metrics(
        self, batch: RolloutBatch, plan: UpdatePlan, acc: MetricAccumulator, out: dict[str, float]
    ) -> tuple[dict[str, float], float, float]:
        """Reduce the updates' metrics over the ranks into ``out`` (losses averaged over the updates); returns the
        off-policy ones apart, and the real tokens and the slots (padding included) the updates computed."""
        micro_batches = [mb for epoch in plan.epochs for mini in epoch for mb in mini]
        real, slots = padding_waste(
            batch.prompt_lengths.tolist(),
            batch.response_lengths.tolist(),
            micro_batches,
            self.layout,
            batch.index.tolist(),
        )
        acc.total("_real_tokens_computed", real)
        acc.total("_slots_computed", slots)
        reduced = acc.reduce(self.ctx)
        for name, key in (("_pg_loss_sum", mc.LEARNER_ACTOR_PG_LOSS), ("_kl_loss_sum", mc.LEARNER_ACTOR_KL_LOSS)):
            if name in reduced:
                reduced[key] = reduced.pop(name) / plan.num_updates
        computed = reduced.pop("_real_tokens_computed")
        total_slots = reduced.pop("_slots_computed")
        offpolicy = {k: reduced.pop(k) for k in list(reduced) if k.startswith("_offpolicy/")}
        out.update(reduced)
        return offpolicy, computed, total_slots

    def _batch_metrics(self, batch: RolloutBatch, offpolicy: dict[str, float] | None = None) -> dict[str, float]:
        """Whole-batch statistics (identical on every rank, so no reduction).

        ``offpolicy``: the reduced sums of :func:`_accumulate_offpolicy` when the proximal pass was skipped."""
        mask, advantages = batch.sampled_mask, batch.advantages
        assert mask is not None and advantages is not None, "the step computes them first"
        adv = advantages[batch.loss_mask.bool()]
        lags = lag_histogram(self.version, batch.versions.tolist())  # weights trained on vs weights that sampled
        # Off-policy gap between the behaviour policy (vLLM) and the proximal policy (learner, current weights).
        if offpolicy is None:
            assert batch.old_log_probs is not None, "the proximal pass ran"
            log_ratio = (batch.old_log_probs - batch.rollout_log_probs)[mask].double()
            w = log_ratio.clamp(-20, 20).exp()
            count, w_sum, w2_sum = float(w.numel()), float(w.sum()), float((w**2).sum())
            abs_sum = float(log_ratio.abs().sum())
        else:
            count, w_sum = offpolicy["_offpolicy/count"], offpolicy["_offpolicy/w_sum"]
            w2_sum, abs_sum = offpolicy["_offpolicy/w2_sum"], offpolicy["_offpolicy/abs_sum"]
        ess = w_sum**2 / (count * w2_sum) if count else 1.0
        distill: dict[str, float] = {}
        if batch.teacher_log_probs is not None:
            gap = (batch.rollout_log_probs - batch.teacher_log_probs)[mask]
            distill[mc.LEARNER_DISTILLATION_REVERSE_KL] = float(gap.mean()) if gap.numel() else 0.0
        scores = batch.token_level_scores.sum(-1)
        groups = batch.index
        group_ids = torch.unique(groups)
        informative = sum(1 for g in group_ids if bool((scores[groups == g] != scores[groups == g][0]).any()))
        return {
            # groups whose samples' rewards differ: the only ones a group-relative advantage learns from
            mc.LEARNER_BATCH_INFORMATIVE_GROUPS: float(informative),
            mc.LEARNER_BATCH_ZERO_ADVANTAGE_SHARE: 1.0 - informative / max(len(group_ids), 1),
            mc.LEARNER_BATCH_SIZE: float(len(batch)),
            mc.LEARNER_BATCH_RESPONSE_LENGTH_MEAN: float(batch.response_lengths.float().mean()),
            mc.LEARNER_BATCH_SAMPLED_LENGTH_MEAN: float(mask.sum(-1).float().mean()),
            mc.LEARNER_BATCH_REWARD_MEAN: float(batch.token_level_scores.sum(-1).mean()),
            mc.LEARNER_BATCH_ADVANTAGES_MEAN: float(adv.mean()) if adv.numel() else 0.0,
            mc.LEARNER_BATCH_ADVANTAGES_MAX: float(adv.max()) if adv.numel() else 0.0,
            mc.LEARNER_BATCH_ADVANTAGES_MIN: float(adv.min()) if adv.numel() else 0.0,
            mc.LEARNER_STALENESS_MEAN: histogram_mean(lags),
            mc.LEARNER_STALENESS_MAX: float(max(lags, default=0)),
            mc.LEARNER_OFFPOLICY_ESS: ess,
            mc.LEARNER_OFFPOLICY_ABS_LOG_RATIO_MEAN: abs_sum / count if count else 0.0,
            **distill,
        }


def kl_controller(algo: AlgorithmConfig) -> KLController | None:
    """The KL-in-reward coefficient's controller (``algorithm.kl_ctrl``); None without ``use_kl_in_reward``."""
    if not algo.use_kl_in_reward:
        return None
    kl = algo.kl_ctrl
    if kl.type == "adaptive":
        return AdaptiveKLController(kl.kl_coef, kl.target_kl, kl.horizon)
    return FixedKLController(kl.kl_coef)


def embedding_rows(model: torch.nn.Module) -> int | None:
    """The rows of a model's input embedding (Qwen pads them past the tokenizer); None when it has no embedding."""
    get = getattr(model, "get_input_embeddings", None)
    embedding = get() if callable(get) else None
    return int(embedding.num_embeddings) if isinstance(embedding, torch.nn.Embedding) else None


def _accumulate_offpolicy(
    acc: MetricAccumulator, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
) -> None:
    """Sums (over ranks and micro-batches) behind the batch's off-policy ESS and mean |log ratio|."""
    log_ratio = (old_log_prob - rollout_log_prob)[mask.bool()].double()
    w = log_ratio.clamp(-20, 20).exp()
    acc.total("_offpolicy/count", float(w.numel()))
    acc.total("_offpolicy/w_sum", w.sum())
    acc.total("_offpolicy/w2_sum", (w**2).sum())
    acc.total("_offpolicy/abs_sum", log_ratio.abs().sum())


def _brief(metrics: dict[str, float]) -> str:
    keys = (
        mc.LEARNER_ACTOR_PG_LOSS,
        mc.LEARNER_ACTOR_ENTROPY,
        mc.LEARNER_ACTOR_GRAD_NORM,
        mc.LEARNER_PERF_TOKENS_PER_S,
    )
    return " ".join(f"{k.rsplit('/', 1)[-1]}={metrics[k]:.4g}" for k in keys if k in metrics)
