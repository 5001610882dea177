"""The PEFT adapter format, shared by the learner (which trains and exports adapters), the weight sync (which carries
them) and the actors (which serve them): what to adapt, PEFT's tensor names and ``adapter_config.json``, and writing an
adapter directory that ``peft.PeftModel.from_pretrained`` and vLLM's ``add_lora`` load.

A leaf module: it imports no role and no torch at import time, so every process can read the format without the
learner's code.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "LoRASpec",
    "adapter_config",
    "is_adapter_name",
    "peft_name",
    "save_adapter",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoRASpec:
    """What to adapt: verl's ``actor_rollout_ref.model.{lora_rank, lora_alpha, target_modules, exclude_modules}``."""

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...]  # "all-linear" or module names
    exclude_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"LoRA rank must be > 0, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.alpha}")
        if isinstance(self.target_modules, str) and self.target_modules != "all-linear":
            raise ValueError(
                f"target_modules must be 'all-linear' or a list of module names, got {self.target_modules!r}"
            )
        if not isinstance(self.target_modules, str) and not self.target_modules:
            raise ValueError("target_modules must not be empty")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def is_adapter_name(name: str) -> bool:
    """Whether a (clean) state-dict name is an adapter tensor (``...lora_A`` / ``...lora_B``)."""
    return name.endswith(".lora_A") or name.endswith(".lora_B")


def peft_name(name: str) -> str | None:
    """PEFT's saved name of an adapter tensor (``base_model.model.<module>.lora_A.weight``); None for other tensors."""
    if not is_adapter_name(name):
        return None
    return f"{_PEFT_PREFIX}{name}.weight"


def adapter_config(spec: LoRASpec, modules: Sequence[str], *, base_model: str = "") -> dict[str, Any]:
    """The ``adapter_config.json`` of this adapter, as PEFT writes it (and vLLM reads it).

    ``target_modules`` lists the adapted modules' last name segments (what PEFT and vLLM match on)."""
    leaves = sorted({m.rsplit(".", 1)[-1] for m in modules})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "target_modules": leaves,
        "exclude_modules": list(spec.exclude_modules) or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    }


def save_adapter(out_dir: str | Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """Write a PEFT adapter directory (``tensors`` under PEFT names), atomically: a reader never sees half of it."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / ADAPTER_WEIGHTS))
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
