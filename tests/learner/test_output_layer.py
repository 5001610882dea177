"""The fused output layer (``use_fused_kernels``): log-probs from hidden states, against the logits path."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from _learner_testlib import collate, scripted_groups, tiny_config, tiny_policy
from torch import nn

from async_rl.algorithms import token_logprobs
from async_rl.learner.dist import local_context
from async_rl.learner.model import build_model
from async_rl.learner.output_layer import fused_output_layer, use_fused_output_layer
from async_rl.learner.policy import build_micro_inputs, response_log_probs
from async_rl.learner.shared_prompt import use_shared_prompt_attention

CPU = torch.device("cpu")


def _pair(tie: bool) -> tuple[nn.Module, nn.Module]:
    """The same tiny policy twice: as it is, and with its output layer switched to the fused path."""
    plain = tiny_policy(seed=4, tie=tie)
    use_shared_prompt_attention(plain)
    fused = copy.deepcopy(plain)
    assert use_fused_output_layer(fused)
    assert fused_output_layer(fused) is not None and fused_output_layer(plain) is None
    return plain, fused


def _step(model: nn.Module, mi, entropy: str) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    model.zero_grad(set_to_none=True)
    lp, ent = response_log_probs(model, mi, temperature=0.7, entropy=entropy)
    loss = (lp * torch.linspace(-1, 1, lp.shape[1])).sum()
    if entropy == "grad":
        assert ent is not None
        loss = loss + 0.1 * ent.sum()
    loss.backward()
    return lp.detach(), None if ent is None else ent.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
@pytest.mark.parametrize("tie", [False, True])
def test_fused_log_probs_and_gradients_equal_the_logits_path(
    layout: str, tie: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, fused = _pair(tie)
    batch = collate(*scripted_groups(3, 2, seed=9))
    mi = build_micro_inputs(batch, list(range(len(batch))), layout=layout, device=CPU)
    monkeypatch.setattr(token_logprobs, "LOGPROB_CHUNK_BYTES", 4 * 64 * 5)  # chunks of 5 rows: several per pass
    for entropy in ("none", "detached", "grad"):
        lp, ent, grads = _step(fused, mi, entropy)
        lp_r, ent_r, grads_r = _step(plain, mi, entropy)
        torch.testing.assert_close(lp, lp_r, atol=1e-6, rtol=0)
        assert bool((lp[batch.response_mask == 0] == 0).all()) and float(lp[batch.response_mask == 1].max()) < 0
        assert (ent is None) == (ent_r is None) == (entropy == "none")
        if ent is not None and ent_r is not None:
            torch.testing.assert_close(ent, ent_r, atol=1e-6, rtol=0)
        assert sorted(grads) == sorted(grads_r)
        for name, g in grads.items():
            torch.testing.assert_close(g, grads_r[name], atol=1e-6, rtol=1e-5, msg=name)
        head = "model.embed_tokens.weight" if tie else "lm_head.weight"
        assert float(grads[head].abs().max()) > 1e-3  # the output layer's weight is trained through the fused path


def test_without_a_request_the_layer_computes_its_logits() -> None:
    plain, fused = _pair(tie=False)
    ids = torch.tensor([[3, 9, 27, 17]])
    with torch.no_grad():
        assert torch.equal(fused(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_fused_pass_keeps_no_vocabulary_sized_tensor() -> None:
    """What autograd keeps for the backward: the logits path keeps [tokens, V] logits, the fused path nothing as big."""
    from transformers import Qwen2ForCausalLM

    cfg = tiny_config()
    cfg.vocab_size = 4096  # the vocabulary dwarfs every activation, as in real models
    torch.manual_seed(0)
    plain = Qwen2ForCausalLM(cfg).float()
    fused = copy.deepcopy(plain)
    assert use_fused_output_layer(fused)
    batch = collate(*scripted_groups(2, 2, seed=3))
    mi = build_micro_inputs(batch, list(range(len(batch))), layout="packed", device=CPU)
    n_tokens = int(mi.labels.numel())
    largest = {}
    for name, model in (("plain", plain), ("fused", fused)):
        sizes: list[int] = []

        def pack(t: torch.Tensor, sizes: list[int] = sizes) -> torch.Tensor:
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            response_log_probs(model, mi, temperature=1.0)
        largest[name] = max(sizes)
    assert largest["plain"] >= n_tokens * 4096  # the logits of every response token
    assert largest["fused"] <= 4096 * cfg.hidden_size  # the output layer's weight is the biggest thing kept


class _Scaled(nn.Module):
    """A model that scales its output layer's logits (as soft-capping or a logit scale would)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_policy(seed=1)

    def get_output_embeddings(self) -> nn.Module:
        return self.inner.lm_head  # type: ignore[no-any-return]

    def forward(self, **kwargs: object) -> SimpleNamespace:
        return SimpleNamespace(logits=self.inner(**kwargs).logits * 2.0)


def test_models_whose_output_is_not_the_layers_are_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    assert not use_fused_output_layer(_Scaled())
    biased = tiny_policy(seed=2)
    biased.lm_head.bias = nn.Parameter(torch.zeros(biased.lm_head.out_features))
    assert not use_fused_output_layer(biased)
    assert fused_output_layer(biased) is None
    with caplog.at_level("WARNING"):
        model = build_model(
            _Scaled,
            local_context(CPU),
            role="actor",
            seed=0,
            compute_dtype=torch.float32,
            gradient_checkpointing=0,
            shared_prompt=False,
            fused_output_layer=True,
            reshard_after_forward=True,
            min_num_params=0,
        )
    assert fused_output_layer(model) is None
    assert "use_fused_kernels has no effect" in caplog.text


def test_single_process_bf16_is_as_close_to_fp32_as_the_logits_path() -> None:
    """bf16 on one process runs the model under autocast: the fused product follows it. Padded, it computes what the
    logits path computes; shared, a prompt's last position predicts n first tokens, whose gradients the fused path
    sums after the output layer (in the hidden states' dtype) rather than before it in bf16 logits."""
    batch = collate(*scripted_groups(3, 2, seed=9))
    for layout in ("padded", "shared"):
        mi = build_micro_inputs(batch, list(range(len(batch))), layout=layout, device=CPU)
        runs = {}
        for name, dtype, fused in (
            ("fused", torch.bfloat16, True),
            ("logits", torch.bfloat16, False),
            ("fp32", torch.float32, False),
        ):
            model = build_model(
                lambda: tiny_policy(seed=4),
                local_context(CPU),
                role="actor",
                seed=0,
                compute_dtype=dtype,
                shared_prompt=True,
                gradient_checkpointing=0,
                fused_output_layer=fused,
                reshard_after_forward=True,
                min_num_params=0,
            )
            assert (fused_output_layer(model) is not None) == fused
            runs[name] = _step(model, mi, "none")
        torch.testing.assert_close(runs["fused"][0], runs["logits"][0], atol=0, rtol=0)  # the same bf16 logits
        names = list(runs["fp32"][2])
        ref, fused_all, logits_all = (
            torch.cat([runs[r][2][n].flatten() for n in names]) for r in ("fp32", "fused", "logits")
        )
        assert all(g.dtype == torch.float32 for g in runs["fused"][2].values())
        fused_err = float((fused_all - ref).norm() / ref.norm())
        logits_err = float((logits_all - ref).norm() / ref.norm())
        assert 0 < logits_err < 2e-2  # bf16's rounding, seen by both paths
        if layout == "padded":
            assert fused_err == logits_err
        else:
            assert fused_err <= 1.25 * logits_err, (fused_err, logits_err)


def test_lora_adapters_train_through_the_fused_layer_and_the_frozen_weight_gets_no_gradient() -> None:
    from async_rl.learner.lora import apply_lora
    from async_rl.peft_format import LoRASpec

    spec = LoRASpec(rank=4, alpha=8.0, target_modules="all-linear")  # every linear layer but the output layer
    plain = tiny_policy(seed=4)
    apply_lora(plain, spec, seed=0)
    use_shared_prompt_attention(plain)
    fused = copy.deepcopy(plain)
    assert use_fused_output_layer(fused)
    batch = collate(*scripted_groups(3, 2, seed=9))
    mi = build_micro_inputs(batch, list(range(len(batch))), layout="shared", device=CPU)
    lp, _, grads = _step(fused, mi, "none")
    lp_r, _, grads_r = _step(plain, mi, "none")
    torch.testing.assert_close(lp, lp_r, atol=1e-6, rtol=0)
    trained = {n for n, p in fused.named_parameters() if p.requires_grad}
    assert trained and all("lora" in n for n in trained) and "lm_head.weight" not in trained
    assert grads["lm_head.weight"] is None
    for name in trained:
        torch.testing.assert_close(grads[name], grads_r[name], atol=1e-6, rtol=1e-5, msg=name)
    assert max(float(grads[n].abs().max()) for n in trained) > 1e-4
