"""The config of a pipeline: training stages run one after another, each from its own config, each stage's exported
model an input of the next ones (``launchers/pipeline.py``).

.. code-block:: yaml

    run_dir: outputs/calculator_pipeline
    stages:
      - name: sft
        kind: sft
        config: configs/sft/smollm2_calculator_tool.yaml
        nproc_per_node: 2
      - name: rl
        kind: rl
        config: configs/smollm2_calculator_tool_grpo.yaml
        inputs: {actor_rollout_ref.model.path: sft}   # the sft stage's exported model
        nproc_per_node: 2
        actors: 1

A stage's ``overrides`` are ``key=value`` strings for its own config; ``inputs`` maps a key of its config to the name
of an earlier stage, whose exported model directory becomes that key's value. Paths in the file are relative to the
directory the launcher runs in, as on a command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import msgspec

from async_rl.config.errors import ConfigError
from async_rl.config.fields import NonNegInt, PosInt, doc
from async_rl.config.loader import load_tree_with_warnings

StageKind = Literal["sft", "rm", "rl", "opd", "generate"]

STAGE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class StageConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One stage: what it runs, from which config, and on how many processes."""

    name: Annotated[
        str, doc("The stage's name: its directory under run_dir, and how later stages name it.", pattern=STAGE_NAME)
    ]
    kind: Annotated[
        StageKind,
        doc(
            "'sft' = async_rl.entrypoints.sft, 'rm' = async_rl.entrypoints.train_reward_model (both under torchrun),"
            " 'rl' = launchers/local.py (the learner group and its actors), 'opd' = the same with"
            " distillation.enabled=true (on-policy distillation; the teacher is distillation.teacher_model.model_path,"
            " e.g. an input from an earlier stage), 'generate' = the same with rejection_sampling.enable=true (its"
            " export is the kept samples' jsonl, an SFT stage's data)."
        ),
    ]
    config: Annotated[str, doc("The stage's YAML config (that kind's tree).")]
    overrides: Annotated[list[str], doc("key=value overrides of the stage's config.")] = msgspec.field(
        default_factory=list
    )
    inputs: Annotated[
        dict[str, str],
        doc(
            "Config key -> earlier stage whose export it gets: a model directory (e.g. actor_rollout_ref.model.path:"
            " sft, distillation.teacher_model.model_path: rl, or reward.reward_model.path: rm), or a 'generate'"
            " stage's dataset (data.train_files: rs)."
        ),
    ] = msgspec.field(default_factory=dict)
    nproc_per_node: Annotated[PosInt, doc("Learner ranks (torchrun --nproc-per-node).")] = 1
    actors: Annotated[
        NonNegInt, doc("vLLM actor processes of an 'rl', 'opd' or 'generate' stage (0 = the config's num_actors).")
    ] = 0


class PipelineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Stages run in order; a finished stage is skipped when the pipeline is run again."""

    run_dir: Annotated[str, doc("Where every stage's run directory goes (<run_dir>/<stage name>).")] = (
        "outputs/pipeline"
    )
    stages: Annotated[list[StageConfig], doc("The stages, in the order they run.")] = msgspec.field(
        default_factory=list
    )


def validate_pipeline(cfg: PipelineConfig) -> list[str]:
    """Names unique, inputs naming earlier stages, an 'rl' stage's actors only on 'rl' (ConfigError naming the
    stage and the key); returns warnings."""
    errors: list[str] = []
    if not cfg.stages:
        errors.append("stages is empty: a pipeline needs at least one stage")
    seen: list[str] = []
    for i, stage in enumerate(cfg.stages):
        where = f"stages[{i}] ({stage.name!r})"
        if stage.name in seen:
            errors.append(f"{where}: the name is used by an earlier stage")
        for key, source in stage.inputs.items():
            if source not in seen:
                errors.append(f"{where}: inputs.{key} names {source!r}, which is not an earlier stage")
        if stage.kind == "generate" and stage.nproc_per_node != 1:
            errors.append(f"{where}: a 'generate' stage runs one learner process; nproc_per_node must be 1")
        if stage.actors and stage.kind not in ("rl", "opd", "generate"):
            errors.append(f"{where}: actors is set but a {stage.kind!r} stage runs no actors")
        seen.append(stage.name)
    if errors:
        raise ConfigError("\n".join(errors))
    return []


def load_pipeline_config(
    paths: Sequence[str] | str | None, overrides: Sequence[str]
) -> tuple[PipelineConfig, list[str]]:
    """A pipeline YAML plus ``key=value`` overrides (``run_dir=...``) into a validated tree."""
    return load_tree_with_warnings(PipelineConfig, validate_pipeline, paths, overrides)


__all__ = ["PipelineConfig", "StageConfig", "StageKind", "load_pipeline_config", "validate_pipeline"]
