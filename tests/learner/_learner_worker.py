"""torchrun worker for the multi-rank learner tests: ``torchrun --nproc_per_node=2 _learner_worker.py SCENARIO OUT``.

Each scenario builds FSDP2 learners on the gloo group and, in the same processes, single-process reference learners
(``local_context``: plain model, world size 1), runs the same work on both and writes what the test asserts on to
``OUT/<scenario>.json`` (rank 0). Comparisons happen here because the FSDP state only exists inside these processes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from _learner_testlib import (  # noqa: E402
    START,
    VOCAB,
    equal_rewards,
    layout,
    replace,
    scripted_groups,
    settings,
    tiny_critic,
    tiny_policy,
)
from torch import nn  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from async_rl.algorithms import token_logprobs  # noqa: E402
from async_rl.learner import (  # noqa: E402
    Learner,
    export_hf,
    init_distributed,
    iter_full_state,
    latest,
    local_context,
    share_batch,
    teardown,
)
from async_rl.learner.grad_reduce import InPlaceReduceScatter  # noqa: E402
from async_rl.learner.model import build_model  # noqa: E402
from async_rl.learner.output_layer import fused_output_layer  # noqa: E402


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            out[name] = g.detach().clone()
    return out


def capture(learner: Learner) -> list[dict[str, torch.Tensor]]:
    store: list[dict[str, torch.Tensor]] = []
    learner.actor.grad_hook = lambda m: store.append(full_grads(m))
    return store


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def digest(learner: Learner) -> str:
    h = hashlib.sha256()
    for name, t in iter_full_state(learner.model, learner.ctx, all_ranks=True, dtype=None):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def plain_sharded(
    source: Any, ctx: Any, *, role: str, reshard_after_forward: bool = True, min_num_params: int = 0
) -> torch.nn.Module:
    """``source`` sharded over the ranks as a plain fp32 policy: seed 0, no checkpointing, no shared prompts, the
    stock output layer."""
    return build_model(
        source,
        ctx,
        role=role,
        seed=0,
        compute_dtype=torch.float32,
        gradient_checkpointing=0,
        shared_prompt=False,
        fused_output_layer=False,
        reshard_after_forward=reshard_after_forward,
        min_num_params=min_num_params,
    )


def scenario_grads(ctx: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    # 1. raw FSDP2: a mean loss over the full batch vs each rank's half, gradients averaged by FSDP
    ref = tiny_policy()
    sharded = plain_sharded(tiny_policy, ctx, role="raw")
    ids = torch.randint(1, 64, (4, 10), generator=torch.Generator().manual_seed(3))
    ref(input_ids=ids).logits.logsumexp(-1).mean().backward()
    half = ids[ctx.rank * 2 : ctx.rank * 2 + 2].to(ctx.device)
    sharded(input_ids=half).logits.logsumexp(-1).mean().backward()
    res["raw_fsdp_vs_single"] = max_diff(full_grads(sharded), full_grads(ref))
    # 2. learner gradient: 2 ranks x small micro-batches vs 1 process x one micro-batch, per loss_agg_mode
    groups = scripted_groups(4, 4, seed=11)
    cases = {
        "token-mean": ((2, "padded"), (3, "padded"), (1, "packed"), (3, "shared")),
        "seq-mean-token-mean": ((3, "padded"), (1, "packed"), (2, "shared")),
        "seq-mean-token-sum": ((2, "padded"), (3, "shared")),
    }
    for mode, variants in cases.items():
        for micro, lay in variants:
            common = dict(ppo_mini_batch_size=4, loss_agg_mode=mode, entropy_coeff=0.01)
            dist_l = Learner(
                settings(ppo_micro_batch_size_per_gpu=micro, **layout(lay), **common), START, ctx, tiny_policy
            )
            local_l = Learner(
                settings(ppo_micro_batch_size_per_gpu=16, **layout("padded"), **common),
                START,
                local_context(),
                tiny_policy,
            )
            g_dist, g_local = capture(dist_l), capture(local_l)
            dist_l.train_step(*groups)
            local_l.train_step(*groups)
            res[f"{mode}/micro{micro}/{lay}"] = max_diff(g_dist[0], g_local[0])
    res["grad_scale"] = float(max(v.abs().max() for v in g_local[0].values()))
    # the fused output layer under FSDP2, on a tied output embedding: the same gradients as the logits path
    tied = lambda: tiny_policy(tie=True)  # noqa: E731
    common = dict(
        ppo_mini_batch_size=4,
        entropy_coeff=0.01,
        use_kl_loss=True,  # the reference model's log-probs come through its fused layer too (no grad)
        kl_loss_coef=0.1,
        ppo_micro_batch_size_per_gpu=3,
        **layout("shared"),
    )
    fused_l = Learner(settings(use_fused_kernels=True, **common), START, ctx, tied)
    local_l = Learner(settings(**common), START, local_context(), tied)
    assert fused_l.ref is not None
    res[f"fused_switched_rank{ctx.rank}"] = (
        fused_output_layer(fused_l.model) is not None and fused_output_layer(fused_l.ref) is not None
    )
    g_fused, g_local = capture(fused_l), capture(local_l)
    token_logprobs.LOGPROB_CHUNK_BYTES = 4 * VOCAB * 5  # chunks of 5 rows: the weight's gradient sums several
    fused_l.train_step(*groups)
    token_logprobs.LOGPROB_CHUNK_BYTES = 32 << 20
    local_l.train_step(*groups)
    res["fused/tied/shared"] = max_diff(g_fused[0], g_local[0])
    # actor.skip_zero_advantage on 2 ranks: 1 of 4 groups has rewards that differ, so 4 rows are computed, split over
    # the ranks, and 12 left out; one process computes all 16
    one_group = (equal_rewards(groups[0], (0, 1, 3)), groups[1])
    for lay in ("shared", "padded"):
        common = dict(ppo_mini_batch_size=4, **layout(lay))
        dist_l = Learner(settings(ppo_micro_batch_size_per_gpu=3, **common), START, ctx, tiny_policy)
        local_l = Learner(
            settings(ppo_micro_batch_size_per_gpu=16, skip_zero_advantage=False, **common),
            START,
            local_context(),
            tiny_policy,
        )
        g_dist, g_local = capture(dist_l), capture(local_l)
        metrics = dist_l.train_step(*one_group)
        local_l.train_step(*one_group)
        res[f"skip/{lay}"] = max_diff(g_dist[0], g_local[0])
        res[f"skip/{lay}/left_out"] = metrics["learner/batch/skipped_sequences"]
    return res


def _two_micro_batch_grads(model: nn.Module, ids: torch.Tensor, ctx: Any) -> dict[str, torch.Tensor]:
    """This rank's two rows of ``ids`` as two micro-batches (the second accumulates), then the local gradient shards."""
    for half in range(2):
        rows = ids[ctx.rank * 2 + half : ctx.rank * 2 + half + 1].to(ctx.device)
        model(input_ids=rows).logits.logsumexp(-1).mean().backward()
    return {n: p.grad.to_local().clone() for n, p in model.named_parameters() if p.grad is not None}


def _bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def scenario_grad_reduce(ctx: Any) -> dict[str, Any]:
    """InPlaceReduceScatter against gloo's reduce-scatter (the collective alone, then FSDP2's gradients through it)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    res: dict[str, Any] = {}
    group = dist.group.WORLD
    comm = InPlaceReduceScatter(ctx.world_size)
    gen = torch.Generator().manual_seed(100 + ctx.rank)  # each rank its own values
    equal = []
    for numel in (2, 6, 1000, 28_314):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            values = torch.randn(numel, generator=gen)
            expected = torch.empty(numel // ctx.world_size)
            dist.reduce_scatter_tensor(expected, values.clone(), op=op)
            buf = comm.allocate((numel,), dtype=torch.float32, device=ctx.device)
            buf.copy_(values)
            out = comm.allocate((numel // ctx.world_size,), dtype=torch.float32, device=ctx.device)
            res.setdefault(f"out_separate_rank{ctx.rank}", True)
            res[f"out_separate_rank{ctx.rank}"] &= out.data_ptr() != buf.data_ptr()
            comm(out, buf, group, op)
            equal.append(torch.equal(out, expected))
    res[f"collective_equal_rank{ctx.rank}"] = equal
    res[f"block_kept_rank{ctx.rank}"] = comm._block is not None and comm._block.numel() == 28_314
    try:
        comm.allocate((5,), dtype=torch.float32, device=ctx.device)
        res["odd_input_error"] = None
    except RuntimeError as exc:
        res["odd_input_error"] = str(exc)
    # FSDP2: build_model on gloo installs it on every unit; gradients equal FSDP2's own collective's bit for bit,
    # over two micro-batches (the second accumulates into the views of the first's output)
    ids = torch.randint(1, 64, (4, 10), generator=torch.Generator().manual_seed(5))
    grads = {}
    for label in ("in_place", "gloo"):
        model = plain_sharded(tiny_policy, ctx, role=label)
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        comms = {type(u._get_fsdp_state()._fsdp_param_groups[0]._reduce_scatter_comm).__name__ for u in units}
        res[f"{label}_units"] = len(units)
        res[f"{label}_comms"] = sorted(comms)
        if label == "gloo":
            from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

            for unit in units:
                unit.set_custom_reduce_scatter(DefaultReduceScatter())
        grads[label] = _two_micro_batch_grads(model, ids, ctx)
    res[f"fsdp_grads_equal_rank{ctx.rank}"] = _bitwise_equal(grads["in_place"], grads["gloo"])
    res["fsdp_grad_count"] = len(grads["gloo"])
    # a tied embedding (learner/tied_embedding.py) under FSDP2: its rows into the output layer's gradient give the
    # bits of the dense embedding gradient and autograd's sum, two micro-batches each
    tied = {}
    for label in ("rows", "dense"):
        model = plain_sharded(lambda: tiny_policy(tie=True), ctx, role=label)
        embedding = model.get_input_embeddings()
        res[f"tied_{label}_switched_rank{ctx.rank}"] = "forward" in vars(embedding)
        if label == "dense":
            del embedding.forward  # back to nn.Embedding's own
        tied[label] = _two_micro_batch_grads(model, ids, ctx)
    res[f"tied_grads_equal_rank{ctx.rank}"] = _bitwise_equal(tied["rows"], tied["dense"])
    res["tied_embedding_grad_norm"] = float(tied["rows"]["model.embed_tokens.weight"].norm())
    return res


def scenario_train(ctx: Any, out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    s = settings(ppo_epochs=2, shuffle=True, max_consecutive_nonfinite=5, **layout("shared"))
    dist_l = Learner(s, START, ctx, tiny_policy)
    local_l = Learner(s, START, local_context(), tiny_policy)  # shuffling by group: the same mini-batches in both
    losses = []
    for step in range(3):
        groups = scripted_groups(4, 4, seed=100 + step, version=step)
        md, ml = dist_l.train_step(*groups), local_l.train_step(*groups)
        losses.append((md["learner/actor/pg_loss"], ml["learner/actor/pg_loss"]))
    res["losses"] = losses
    exported = dict(iter_full_state(dist_l.model, ctx, to_cpu=True, dtype=None))
    if ctx.is_rank0:
        reference = {k: v.detach() for k, v in local_l.model.state_dict().items()}
        res["export_names_match"] = sorted(exported) == sorted(reference)
        res["export_max_diff"] = max(float((exported[k] - reference[k]).abs().max()) for k in reference)
        res["weights_moved"] = max(float((v - tiny_policy().state_dict()[k]).abs().max()) for k, v in reference.items())
    else:
        res["nonzero_rank_items"] = len(exported)
    hf_dir = export_hf(dist_l.model, ctx, out / "hf", max_shard_bytes=100_000, dtype=None)
    if ctx.is_rank0:
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
        res["hf_reload_max_diff"] = max(float((loaded.state_dict()[k] - v).abs().max()) for k, v in exported.items())
        res["hf_shards"] = len(list(hf_dir.glob("*.safetensors")))
    # rank 0's collated batch reaches every rank as tensors, equal to what each rank would collate itself
    expected = dist_l.collate(*scripted_groups(2, 2, seed=5))
    got, ids = share_batch(ctx, expected if ctx.is_rank0 else None, [7, 9] if ctx.is_rank0 else None)
    res[f"share_batch_rank{ctx.rank}"] = (
        ids == [7, 9]
        and list(got.tensors()) == list(expected.tensors())
        and all(
            torch.equal(got.tensors()[k], v) and got.tensors()[k].dtype == v.dtype
            for k, v in expected.tensors().items()
        )
    )
    # a tied output embedding survives sharding and is exported once, under the input-embedding name
    tied = plain_sharded(lambda: tiny_policy(seed=2, tie=True), ctx, role="tied")
    tied_full = dict(iter_full_state(tied, ctx, all_ranks=True, dtype=None))
    tied_ref = tiny_policy(seed=2, tie=True).state_dict()
    res[f"tied_export_ok_rank{ctx.rank}"] = "lm_head.weight" not in tied_full and all(
        torch.equal(v, tied_ref[k]) for k, v in tied_full.items()
    )
    # fsdp_config.reshard_after_forward: true frees each decoder layer's gathered parameters after its forward
    # (sharded DTensors again), false keeps them gathered (plain tensors) until the backward
    for reshard in (True, False):
        unit = plain_sharded(tiny_policy, ctx, role="reshard", reshard_after_forward=reshard)
        loss = unit(torch.tensor([[1, 2, 3, 4]])).logits.float().sum()
        res[f"layers_sharded_after_forward_{reshard}_rank{ctx.rank}"] = all(
            isinstance(p, DTensor) for layer in unit.model.layers for p in layer.parameters()
        )
        loss.backward()  # the backward reshards either way
        res[f"sharded_after_backward_{reshard}_rank{ctx.rank}"] = all(isinstance(p, DTensor) for p in unit.parameters())
    # fsdp_config.wrap_policy.min_num_params: both decoder layers in one FSDP2 unit (one state), the same gradients
    grads, states = {}, {}
    for min_params in (0, 1 << 30):
        model = plain_sharded(tiny_policy, ctx, role="units", min_num_params=min_params)
        layers = list(model.model.layers)
        states[min_params] = layers[0]._get_fsdp_state() is layers[1]._get_fsdp_state()
        model(torch.tensor([[1, 2, 3, 4, 5]])).logits.float().pow(2).mean().backward()
        grads[min_params] = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    res[f"one_state_per_layer_rank{ctx.rank}"] = not states[0]
    res[f"grouped_layers_share_a_state_rank{ctx.rank}"] = states[1 << 30]
    res[f"grouped_grads_equal_rank{ctx.rank}"] = sorted(grads[0]) == sorted(grads[1 << 30]) and all(
        torch.allclose(g, grads[1 << 30][n], rtol=1e-6, atol=1e-7) for n, g in grads[0].items()
    )
    # gathered in bf16 (each shard cast first, as the weight sync does): exactly the fp32 gather, rounded
    tied_bf16 = dict(iter_full_state(tied, ctx, all_ranks=True, dtype=torch.bfloat16))
    res[f"bf16_gather_exact_rank{ctx.rank}"] = sorted(tied_bf16) == sorted(tied_full) and all(
        v.dtype == torch.bfloat16 and torch.equal(v, tied_full[k].to(torch.bfloat16)) for k, v in tied_bf16.items()
    )
    res.update(uneven_gather(ctx))
    # a NaN loss on rank 1 only: every rank must skip the same step and keep its weights
    before = digest(dist_l)
    dist_l.loss_hook = (lambda loss: loss * float("nan")) if ctx.rank == 1 else None
    m = dist_l.train_step(*scripted_groups(4, 4, seed=200, version=3))
    res[f"nan_skipped_rank{ctx.rank}"] = m["learner/actor/skipped_updates"]
    res[f"nan_unchanged_rank{ctx.rank}"] = digest(dist_l) == before
    return res


def uneven_gather(ctx: Any) -> dict[str, Any]:
    """The batched gather of iter_full_state on rows that do not split evenly over the ranks (5, 3 and 7 rows; a
    1-row tensor leaves rank 1 an empty shard), in one batch and in batches of one tensor, fp32 and bf16."""
    from torch.distributed.fsdp import fully_shard

    import async_rl.learner.export as export

    torch.manual_seed(7)
    shapes = {"a": (5, 3), "b": (1, 4), "c": (7,), "d": (3, 2, 2), "e": (2, 6)}
    ref = nn.ParameterDict({k: nn.Parameter(torch.randn(*v)) for k, v in shapes.items()})
    model = nn.ParameterDict({k: nn.Parameter(v.detach().clone()) for k, v in ref.items()})
    fully_shard(model)
    local_rows = {k: v.to_local().shape[0] for k, v in model.items()}
    out: dict[str, Any] = {f"uneven_rank1_empty_shard_rank{ctx.rank}": ctx.rank == 0 or local_rows["b"] == 0}
    saved = export.GATHER_BATCH_BYTES
    try:
        for cap, label in ((1 << 20, "one_batch"), (1, "per_tensor")):
            export.GATHER_BATCH_BYTES = cap
            for dtype in (None, torch.bfloat16):
                got = list(iter_full_state(model, ctx, all_ranks=True, dtype=dtype))
                want = {k: v.detach() if dtype is None else v.detach().to(dtype) for k, v in ref.items()}
                out[f"uneven_{label}_{dtype}_rank{ctx.rank}"] = [k for k, _ in got] == list(shapes) and all(
                    t.dtype == want[k].dtype and torch.equal(t, want[k]) for k, t in got
                )
    finally:
        export.GATHER_BATCH_BYTES = saved
    return out


def resume_settings() -> Any:
    return settings(
        adv_estimator="gae",
        critic=dict(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2),
        use_kl_in_reward=True,
        kl_ctrl_type="adaptive",
        use_kl_loss=True,
        shuffle=True,
    )


def scenario_resume(ctx: Any, out: Path, phase: str) -> dict[str, Any]:
    res: dict[str, Any] = {}
    learner = Learner(resume_settings(), START, ctx, tiny_policy, critic=tiny_critic)
    root = out / "ckpt"
    k = 2
    if phase == "a":
        for step in range(k):
            learner.train_step(*scripted_groups(4, 4, seed=300 + step, version=step))
        learner.save_checkpoint(root, extra={"cursor": 7, "ledger": b"\x00\x01"}, keep_last=2)
    else:
        # a save of the next version that was killed before it committed
        if ctx.is_rank0:
            (root / f"step_{k + 1}.tmp" / "dcp").mkdir(parents=True)
        ctx.barrier()
        path = latest(root)
        res["resumed_from"] = None if path is None else path.name
        assert path is not None
        extra = learner.load_checkpoint(path)
        res["extra"] = {"cursor": extra["cursor"], "ledger": list(extra["ledger"])} if isinstance(extra, dict) else None
        res["version"] = learner.version
    # the same RNG consumers as training code might have: python/numpy/torch draws must continue identically
    res["rng_draw"] = float(torch.rand(()).item())
    for step in range(k, k + 2):
        m = learner.train_step(*scripted_groups(4, 4, seed=300 + step, version=step))
        res[f"step{step}"] = {
            key: m[key] for key in ("learner/actor/pg_loss", "learner/critic/loss", "learner/reward_kl_penalty_coeff")
        }
        res[f"digest{step}"] = digest(learner)
    return res


def scenario_lora(ctx: Any, out: Path) -> dict[str, Any]:
    """LoRA under FSDP2: adapter gradients vs one process, a frozen base, and resume of adapter + optimizer."""
    from async_rl.peft_format import LoRASpec

    res: dict[str, Any] = {}
    s = settings(lora=LoRASpec(rank=4, alpha=8.0, target_modules="all-linear"), use_kl_loss=True, seed=5)
    dist_l = Learner(s, START, ctx, tiny_policy)
    local_l = Learner(replace(s, ppo_micro_batch_size_per_gpu=16), START, local_context(), tiny_policy)
    g_dist, g_local = capture(dist_l), capture(local_l)
    for step in range(2):
        groups = scripted_groups(4, 4, seed=500 + step, version=step)
        dist_l.train_step(*groups)
        local_l.train_step(*groups)
    res["grad_names"] = sorted(g_dist[0])
    res["grad_max_diff"] = max(max_diff(a, b) for a, b in zip(g_dist, g_local, strict=True))
    res["grad_scale"] = float(max(v.abs().max() for v in g_local[-1].values()))
    full = dict(iter_full_state(dist_l.model, ctx, all_ranks=True, dtype=None))
    base = tiny_policy().state_dict()
    res[f"base_identical_rank{ctx.rank}"] = all(torch.equal(full[k], v) for k, v in base.items())
    res[f"adapter_vs_local_rank{ctx.rank}"] = max(
        float((full[k] - v).abs().max()) for k, v in local_l.model.state_dict().items() if "lora_" in k
    )
    root = out / "ckpt"
    dist_l.save_checkpoint(root, extra=None, keep_last=None)
    resumed = Learner(s, START, ctx, tiny_policy)
    path = latest(root)
    assert path is not None
    resumed.load_checkpoint(path)
    res[f"resumed_digest_equal_rank{ctx.rank}"] = digest(resumed) == digest(dist_l)
    groups = scripted_groups(4, 4, seed=510, version=2)
    a, b = dist_l.train_step(*groups), resumed.train_step(*groups)
    res[f"resumed_step_equal_rank{ctx.rank}"] = a["learner/actor/pg_loss"] == b["learner/actor/pg_loss"] and digest(
        resumed
    ) == digest(dist_l)
    return res


def scenario_gpu(ctx: Any) -> dict[str, Any]:
    """CUDA: bf16 compute with fp32 master weights (MixedPrecisionPolicy), NCCL collectives, bf16 export."""
    res: dict[str, Any] = {"device": ctx.device.type, "backend": ctx.backend}
    learner = Learner(settings(entropy_coeff=0.01), START, ctx, tiny_policy)
    metrics = [learner.train_step(*scripted_groups(4, 4, seed=400 + i)) for i in range(2)]
    res["finite"] = all(math.isfinite(v) for m in metrics for v in m.values())
    res["master_fp32"] = all(p.dtype == torch.float32 for p in learner.model.parameters())
    exported = list(iter_full_state(learner.model, ctx, dtype=torch.bfloat16))
    res["export_bf16"] = (not ctx.is_rank0) or all(t.dtype == torch.bfloat16 for _, t in exported)
    return res


def _cosine(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    va = torch.cat([a[k].double().flatten() for k in sorted(a)])
    vb = torch.cat([b[k].double().flatten() for k in sorted(a)])
    return float(va @ vb / (va.norm() * vb.norm()))


def _precision_step(ctx: Any, param_dtype: str, groups: tuple[list[Any], dict[int, list[int]]]) -> dict[str, Any]:
    """One GAE + KL-loss step (2 mini-batches) at ``param_dtype``; what ``scenario_precision`` compares."""
    s = settings(
        adv_estimator="gae",
        critic=dict(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2),
        use_kl_loss=True,
        entropy_coeff=0.01,
        param_dtype=param_dtype,
    )
    learner = Learner(s, START, ctx, tiny_policy, critic=tiny_critic)
    assert learner.ref is not None and learner.critic is not None
    models = {"actor": learner.model, "ref": learner.ref, "critic": learner.critic.model}
    hooked = {f"{role}/layer0.o_proj": m.get_submodule("model.layers.0.self_attn.o_proj") for role, m in models.items()}
    hooked["actor/lm_head"] = learner.model.get_submodule("lm_head")  # in the root FSDP unit
    hooked["critic/score"] = learner.critic.model.get_submodule("score")
    seen: dict[str, set[str]] = {key: set() for key in hooked}  # weight/input/output dtypes of each Linear's calls

    def record(key: str, m: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        seen[key].add("/".join(str(t.dtype).removeprefix("torch.") for t in (m.weight, inputs[0], out)))

    for key, linear in hooked.items():
        linear.register_forward_hook(lambda m, i, o, key=key: record(key, m, i, o))
    grad_dtypes: set[str] = set()
    first: list[dict[str, torch.Tensor]] = []  # the actor's first mini-batch (the critic updates before it)

    def on_grads(m: nn.Module, keep: list[dict[str, torch.Tensor]] | None) -> None:
        for p in m.parameters():
            if p.grad is not None:
                local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                grad_dtypes.update({str(p.grad.dtype), str(local.dtype)})
        if keep is not None and not keep:
            keep.append(full_grads(m))

    learner.actor.grad_hook = lambda m: on_grads(m, first)
    learner.critic.trained.grad_hook = lambda m: on_grads(m, None)
    batch = learner.collate(*groups)
    log_probs = learner._log_probs(learner.model, batch)
    metrics = learner.train_step(*groups)
    optimizers = (learner.actor.optimizer, learner.critic.trained.optimizer)
    return {
        "compute_dtype": str(learner.compute_dtype),
        "seen": {k: sorted(v) for k, v in seen.items()},
        "grad_dtypes": sorted(grad_dtypes),
        # the trained models' parameters are their fp32 shards (the frozen reference's root unit stays gathered
        # after its no-grad forward, FSDP2's root heuristic, so its parameters are not checked here)
        "master_dtypes": sorted(
            {f"{type(p).__name__}:{p.dtype}" for role in ("actor", "critic") for p in models[role].parameters()}
        ),
        "optim_state_dtypes": sorted(
            {str(v.dtype) for o in optimizers for st in o.state.values() for v in st.values() if torch.is_tensor(v)}
        ),
        "finite": all(math.isfinite(v) for v in metrics.values()),
        "metrics": {
            k: metrics[f"learner/{k}"]
            for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "critic/loss", "actor/skipped_updates")
        },
        "_log_probs": log_probs,
        "_adv_abs_max": max(abs(metrics["learner/batch/advantages_max"]), abs(metrics["learner/batch/advantages_min"])),
        "_mask": batch.response_mask.bool(),
        "_grads": first[0],
    }


def scenario_precision(ctx: Any) -> dict[str, Any]:
    """CPU, gloo: one step with param_dtype bf16 (FSDP2 MixedPrecisionPolicy) against the same step in fp32, from
    the same weights and batch: the dtypes each model role computes and keeps, log-probs, gradients and losses."""
    res: dict[str, Any] = {"device": ctx.device.type, "backend": ctx.backend}
    groups = scripted_groups(4, 4, seed=500)
    runs = {pd: _precision_step(ctx, pd, groups) for pd in ("fp32", "bf16")}
    for pd, run in runs.items():
        res.update({f"{pd}/{k}": v for k, v in run.items() if not k.startswith("_")})
    mask = runs["fp32"]["_mask"]
    lp32, lp16 = runs["fp32"]["_log_probs"], runs["bf16"]["_log_probs"]
    diff = (lp32 - lp16).abs()[mask]
    res["logprob_abs_diff_mean"] = float(diff.mean())
    res["logprob_abs_diff_max"] = float(diff.max())
    res["logprob_abs_mean"] = float(lp32.abs()[mask].mean())
    res["grad_cosine"] = _cosine(runs["fp32"]["_grads"], runs["bf16"]["_grads"])
    res["adv_abs_max"] = runs["fp32"]["_adv_abs_max"]
    return res


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    ctx = init_distributed(backend="auto", timeout_s=300.0)
    if scenario == "grads":
        res = scenario_grads(ctx)
    elif scenario == "grad_reduce":
        res = scenario_grad_reduce(ctx)
    elif scenario == "train":
        res = scenario_train(ctx, out)
    elif scenario == "lora":
        res = scenario_lora(ctx, out)
    elif scenario == "gpu":
        res = scenario_gpu(ctx)
    elif scenario == "precision":
        res = scenario_precision(ctx)
    elif scenario.startswith("resume_"):
        res = scenario_resume(ctx, out, scenario[-1])
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    # merge per-rank results on rank 0 through files (keeps the worker free of object collectives)
    (out / f"{scenario}.rank{ctx.rank}.json").write_text(json.dumps(res, default=lambda x: None))
    ctx.barrier()
    if ctx.is_rank0:
        merged: dict[str, Any] = {}
        for r in range(ctx.world_size):
            merged.update(json.loads((out / f"{scenario}.rank{r}.json").read_text()))
        (out / f"{scenario}.json").write_text(json.dumps(merged, indent=1))
    teardown(ctx)
    assert not any(isinstance(v, float) and math.isnan(v) for v in res.values())


if __name__ == "__main__":
    main()
    # Results are on disk: skip interpreter finalization, where gloo's worker threads can abort the process
    # ("terminate called without an active exception", seen once in CI-like runs; a known torch/gloo teardown race).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
