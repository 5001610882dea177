"""Parameters a vLLM model shares between modules (a tied output layer: ``lm_head.weight`` *is*
``embed_tokens.weight``), kept shared, and computed with, across weight updates.

vLLM 0.32's layer-wise reload (``initialize_layerwise_reload`` / ``finalize_layerwise_reload``, what every update
runs, ``actor/vllm_ext.py``) copies the new values into each layer's parameters and processes again only the layers
that loaded something. A tied output layer loads nothing: the checkpoint and the learner send the tensor once, as the
embedding ("ParallelLMHead: Failed to load weights" in vLLM's log). Its parameter still is the embedding's, so on a
GPU, where its matmul reads the parameter, it is right. On CPU vLLM packs the output layer's weight into a oneDNN
matmul when it processes the layer, and that packed copy kept the weights of the engine's first load: after every
update the engine sampled from the updated model through its original output layer (the tiny tied model after one
update: log-probs up to 1.2 nats off a transformers forward of the same weights, and within 5e-7 of one with the
original output layer). SmolLM2 and Qwen2.5-0.5B tie theirs.

:class:`TiedParameters` records, while the model is live, which modules share a parameter. After a reload,
:meth:`TiedParameters.restore` makes every follower hold its leader's parameter (a reload that replaced it) and lets
its quant method process it again (on CPU that packs the output layer's matmul from the new weight; on GPUs it does
nothing for an unquantised layer), and :meth:`TiedParameters.check` reads a few columns of the leader's weight back
through each follower's own kernel with one-hot inputs, which must give them exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from async_rl.weight_sync.errors import WeightMismatchError

__all__ = ["TiedParameters"]


@contextmanager
def _full_fp32_matmuls() -> Iterator[None]:
    """fp32 products in full precision while probing (a GPU may run them in TF32, which would round the weights read
    back); 16-bit products of one-hot rows are exact anyway."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@dataclass(frozen=True)
class _Tie:
    """One shared parameter: where its first holder (in module order) keeps it, and every other holder."""

    leader: nn.Module
    leader_attr: str
    name: str  # the leader's parameter name, for messages
    followers: tuple[tuple[nn.Module, str, str], ...]  # (module, attribute, parameter name)


class TiedParameters:
    """The model's shared parameters; build it while the model is live (before a layer-wise reload)."""

    def __init__(self, model: nn.Module, probe_columns: int = 4) -> None:
        if probe_columns < 1:
            raise ValueError(f"probe_columns must be >= 1, got {probe_columns}")
        self.probe_columns = probe_columns
        holders: dict[int, list[tuple[nn.Module, str, str]]] = {}
        for mod_name, module in model.named_modules():
            for attr, param in module.named_parameters(recurse=False):
                holders.setdefault(id(param), []).append((module, attr, f"{mod_name}.{attr}" if mod_name else attr))
        self.ties = [
            _Tie(leader=group[0][0], leader_attr=group[0][1], name=group[0][2], followers=tuple(group[1:]))
            for group in holders.values()
            if len(group) > 1
        ]

    @property
    def names(self) -> list[str]:
        """The followers' parameter names (``["lm_head.weight"]`` for a tied output layer)."""
        return [name for tie in self.ties for _, _, name in tie.followers]

    @property
    def classes(self) -> set[str]:
        """The followers' module classes (``{"ParallelLMHead"}`` for vLLM's tied output layer)."""
        return {type(module).__name__ for tie in self.ties for module, _, _ in tie.followers}

    def restore(self) -> None:
        """After a reload: every follower holds its leader's parameter, processed again as after a first load."""
        for tie in self.ties:
            param = getattr(tie.leader, tie.leader_attr)
            for module, attr, _ in tie.followers:
                if getattr(module, attr) is not param:
                    module.register_parameter(attr, param)
                method = getattr(module, "quant_method", None)
                process = getattr(method, "process_weights_after_loading", None)
                if callable(process):
                    process(module)

    def check(self) -> None:
        """Raise :class:`WeightMismatchError` unless every follower computes with its leader's current weight."""
        for tie in self.ties:
            param = getattr(tie.leader, tie.leader_attr)
            for module, attr, name in tie.followers:
                if getattr(module, attr) is not param:
                    raise WeightMismatchError(f"{name} no longer shares {tie.name} after the update", tensor=name)
                apply = getattr(getattr(module, "quant_method", None), "apply", None)
                if param.ndim != 2 or not callable(apply):
                    continue
                cols = torch.linspace(0, param.shape[1] - 1, min(self.probe_columns, param.shape[1])).long()
                onehot = torch.zeros(len(cols), param.shape[1], dtype=param.dtype, device=param.device)
                onehot[torch.arange(len(cols), device=param.device), cols.to(param.device)] = 1
                with torch.no_grad(), _full_fp32_matmuls():
                    got = apply(module, onehot).float()
                want = param.detach()[:, cols.to(param.device)].t().float()
                if got.shape != want.shape or not torch.equal(got, want):
                    raise WeightMismatchError(
                        f"{name} does not compute with the updated {tie.name}: its kernel still holds other weights",
                        tensor=name,
                    )
