"""The ``data`` section (prompt files, lengths, batch size) and the reward sections.

``reward`` is this system's own reward-function spec ("module:function", run in a sandboxed worker with a timeout)
plus ``reward.reward_kwargs``, verl 0.9.1's reward-manager options (DAPO's overlong reward shaping, applied by the
actors: :mod:`async_rl.rewards.shaping`). ``custom_reward_function`` is verl's file-path form and, when its ``path`` is
set, is used instead. ``reward.reward_model`` (verl 0.9's keys) adds a learned reward model's score to every
completion's reward, served beside the actors (:mod:`async_rl.rewards.server`) or scored inside each actor.

``reward_model`` is verl's older learned-reward-model section. ``reward_model.enable`` and ``reward_model.model.path``
are aliases of ``reward.reward_model.enable`` and ``model_path``; ``reward_model.reward_kwargs.*`` and the DAPO recipe's
``reward_model.overlong_buffer.*`` are older spellings of ``reward.reward_kwargs`` that verl still migrates. Validation
maps them all onto the ``reward`` section (two spellings set to different values is an error naming both keys); its
other keys are accepted with a warning that they do nothing.
"""

from typing import Annotated, Any

import msgspec

from async_rl.config.fields import NonNegFloat, NonNegInt, Port, PosFloat, PosInt, doc, noop
from async_rl.config.names import RewardModelDtype, RewardModelPlacement, Truncation

BUILTIN_DATA = "builtin:arith"
DEFAULT_REWARD_FUNCTION = "async_rl.rewards.arith:compute_score"


class DataConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Prompt data and per-step batch size."""

    train_files: Annotated[
        str | list[str],
        doc(f"Training prompt file(s) (parquet/jsonl); '{BUILTIN_DATA}' = the embedded arithmetic task (train split)."),
    ] = BUILTIN_DATA
    val_files: Annotated[
        str | list[str] | None,
        doc(f"Validation prompt file(s); '{BUILTIN_DATA}' = the arithmetic task's eval split; null = no validation."),
    ] = BUILTIN_DATA
    train_max_samples: Annotated[
        int,
        doc(
            "Training prompts: -1 = all; N = N of them (drawn with data.seed when data.shuffle, else the first N),"
            " as verl's data.train_max_samples.",
            ge=-1,
        ),
    ] = -1
    val_max_samples: Annotated[
        int,
        doc(
            "Validation prompts per round: -1 = all; N = N of them (drawn with data.seed when data.shuffle, else the"
            " first N), as verl's data.val_max_samples.",
            ge=-1,
        ),
    ] = -1
    prompt_key: Annotated[str, doc("Record field holding the prompt (a string or a chat message list).")] = "prompt"
    max_prompt_length: Annotated[PosInt, doc("Max prompt tokens (longer prompts: see filter_overlong_prompts).")] = 16
    max_response_length: Annotated[PosInt, doc("Max generated tokens per completion.")] = 8
    train_batch_size: Annotated[PosInt, doc("PROMPTS per training step (each sampled rollout.n times).")] = 16
    shuffle: Annotated[bool, doc("Shuffle the training prompts every epoch.")] = True
    seed: Annotated[int, doc("Seed of the training-prompt shuffle.")] = 1
    filter_overlong_prompts: Annotated[
        bool, doc("Drop prompts longer than max_prompt_length when loading (else apply `truncation`).")
    ] = False
    truncation: Annotated[
        Truncation, doc("Over-long prompt handling: 'error' or which side to cut ('left', 'right', 'middle').")
    ] = "error"
    trust_remote_code: Annotated[bool, noop("Tokenizer remote code (use actor_rollout_ref.model's).")] = False
    tokenizer: Annotated[str | None, noop("Separate tokenizer path (the policy's tokenizer is used).")] = None
    reward_fn_key: Annotated[str, noop("Record field selecting the reward function.")] = "data_source"
    val_batch_size: Annotated[int | None, noop("Deprecated in verl; validation uses the whole set.")] = None
    return_raw_input_ids: Annotated[bool, noop("verl dataset option.")] = False
    return_raw_chat: Annotated[bool, noop("verl dataset option.")] = False
    return_full_prompt: Annotated[bool, noop("verl dataset option.")] = False
    dataloader_num_workers: Annotated[int, noop("verl data-loader workers.")] = 8
    filter_overlong_prompts_workers: Annotated[int, noop("verl filter workers.")] = 1
    use_shm: Annotated[bool, noop("Shared-memory copy of the data.")] = False
    validation_shuffle: Annotated[bool, noop("Shuffle validation data.")] = False
    image_key: Annotated[str, noop("Multimodal image field.")] = "images"
    video_key: Annotated[str, noop("Multimodal video field.")] = "videos"
    custom_cls: Annotated[dict[str, Any], noop("Custom dataset class.")] = msgspec.field(default_factory=dict)


class OverlongBufferConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """DAPO's overlong reward shaping (verl ``reward.reward_kwargs.overlong_buffer_cfg``)."""

    enable: Annotated[
        bool,
        doc(
            "Add a length penalty to every reward: 0 up to max_resp_len - len tokens, then falling linearly to"
            " -penalty_factor at max_resp_len (score + min(-(length - (max_resp_len - len)) / len * penalty_factor,"
            " 0)); applied by the actors, so the reward sent to the learner is the shaped one."
        ),
    ] = False
    len: Annotated[NonNegInt, doc("Tokens of the penalty zone before max_resp_len (> 0 when enable).")] = 0
    penalty_factor: Annotated[NonNegFloat, doc("Penalty at max_resp_len tokens (the zone's full depth).")] = 1.0
    log: Annotated[
        bool,
        doc(
            "Also report the 0/1 reward component 'overlong' (penalised or not); the penalty itself is always the"
            " component 'overlong_reward' when enable."
        ),
    ] = False


class RewardKwargsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """verl's reward-manager options (``reward.reward_kwargs``); only DAPO's overlong shaping is supported."""

    overlong_buffer_cfg: Annotated[OverlongBufferConfig, doc("DAPO overlong reward shaping.")] = msgspec.field(
        default_factory=OverlongBufferConfig
    )
    max_resp_len: Annotated[
        PosInt | None, doc("Response length the overlong penalty is measured against; null = data.max_response_length.")
    ] = None


class OverlongBufferAlias(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An older spelling of ``reward.reward_kwargs.overlong_buffer_cfg`` (null = not set here)."""

    enable: Annotated[bool | None, doc("Alias of reward.reward_kwargs.overlong_buffer_cfg.enable.")] = None
    len: Annotated[NonNegInt | None, doc("Alias of reward.reward_kwargs.overlong_buffer_cfg.len.")] = None
    penalty_factor: Annotated[
        NonNegFloat | None, doc("Alias of reward.reward_kwargs.overlong_buffer_cfg.penalty_factor.")
    ] = None
    log: Annotated[bool | None, doc("Alias of reward.reward_kwargs.overlong_buffer_cfg.log.")] = None


class RewardKwargsAlias(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """verl's transitional ``reward_model.reward_kwargs`` (migrated to ``reward.reward_kwargs``; null = not set)."""

    overlong_buffer_cfg: Annotated[OverlongBufferAlias, doc("Alias of reward.reward_kwargs.overlong_buffer_cfg.")] = (
        msgspec.field(default_factory=OverlongBufferAlias)
    )
    max_resp_len: Annotated[PosInt | None, doc("Alias of reward.reward_kwargs.max_resp_len.")] = None


class RewardModelServeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A learned reward model (a Bradley-Terry export of ``tools/train_reward_model.py``) scoring every completion."""

    enable: Annotated[
        bool,
        doc(
            "Score every completion with the reward model at model_path too: the reward becomes"
            " rule_weight x the rule score (reward.function) + weight x the model's score, both kept as components."
        ),
    ] = False
    model_path: Annotated[
        str | None,
        doc(
            "Directory the reward-model trainer exported (<run dir>/hf): a transformers sequence-classification"
            " model (num_labels=1) over the policy's tokenizer, with reward_stats.json beside it."
        ),
    ] = None
    weight: Annotated[float, doc("Weight of the model's score in the reward (component 'reward_model').")] = 1.0
    rule_weight: Annotated[
        float,
        doc("Weight of the rule score in the reward (component 'rule'; 0 = the model alone, the rule still logged)."),
    ] = 1.0
    normalize: Annotated[
        bool, doc("Standardise the model's score with the mean and std of reward_stats.json in model_path.")
    ] = True
    placement: Annotated[
        RewardModelPlacement,
        doc(
            "'server': one reward-server process beside the actors batches every actor's requests (the launcher"
            " starts and restarts it); 'inline': each actor process loads the model and scores its own groups."
        ),
    ] = "server"
    port: Annotated[
        Port,
        doc(
            "The reward server's port on async_training.transport.host (its CURVE keys too); actors connect to the"
            " coordinator's host at this port. 0 = the launcher picks a free one."
        ),
    ] = 0
    server_host: Annotated[
        str | None,
        doc(
            "Host the actors dial for the reward server (at port); null = the coordinator's host, where"
            " launchers/local.py runs it. launchers/actor_node.sh runs one per actor node and sets 127.0.0.1."
        ),
    ] = None
    dtype: Annotated[
        RewardModelDtype,
        doc(
            "Precision of the scoring forward pass: 'auto' = bfloat16 on CUDA, on CPUs with amx_bf16 and on AMD"
            " CPUs with avx512_bf16, else float32 (the learner's rule)."
        ),
    ] = "auto"
    max_batch_sequences: Annotated[
        PosInt, doc("Most sequences scored in one forward pass (the server batches requests of all actors up to it).")
    ] = 64
    cpu_threads: Annotated[
        PosInt | None,
        doc(
            "torch threads of the scoring forward pass on a CPU (the reward server's process, or each actor's with"
            " placement 'inline'); null = torch's default (every core, which competes with the learner and vLLM)."
        ),
    ] = None
    max_length: Annotated[
        PosInt | None,
        doc("A longer sequence keeps its last max_length tokens (null = max_prompt_length + max_response_length)."),
    ] = None
    retries: Annotated[
        NonNegInt,
        doc(
            "Requests repeated after a missed deadline (reward.timeout_s each) before the actor gives the group up;"
            " its prompt is then granted again (after transport.lease_timeout_s)."
        ),
    ] = 2


class RewardConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """This system's reward function (scored in a separate worker process) and reward shaping."""

    function: Annotated[
        str,
        doc(
            "Reward function as 'package.module:function' taking (completion, ground_truth, prompt, extra);"
            " ignored when custom_reward_function.path is set."
        ),
    ] = DEFAULT_REWARD_FUNCTION
    timeout_s: Annotated[
        PosFloat,
        doc(
            "Seconds one reward-function call may take before it scores 0 and is logged; also the deadline of one"
            " reward-model request."
        ),
    ] = 10.0
    reward_kwargs: Annotated[RewardKwargsConfig, doc("verl reward-manager options (DAPO overlong shaping).")] = (
        msgspec.field(default_factory=RewardKwargsConfig)
    )
    reward_model: Annotated[RewardModelServeConfig, doc("A learned reward model's score added to the reward.")] = (
        msgspec.field(default_factory=RewardModelServeConfig)
    )


class CustomRewardFunctionConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """verl's reward-function-from-file option."""

    path: Annotated[
        str | None, doc("Python file defining the reward function (verl signature); null = use reward.function.")
    ] = None
    name: Annotated[str, doc("Function name inside `path`.")] = "compute_score"


class RewardModelModelAlias(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """verl's older ``reward_model.model`` (only ``path`` is used: an alias of ``reward.reward_model.model_path``)."""

    path: Annotated[str | None, doc("Alias of reward.reward_model.model_path.")] = None
    input_tokenizer: Annotated[
        str | None, noop("Re-tokenise for the reward model (it must share the policy's tokenizer here).")
    ] = None
    external_lib: Annotated[str | None, noop("External model code.")] = None
    trust_remote_code: Annotated[bool, noop("Reward-model remote code.")] = False
    override_config: Annotated[dict[str, Any], noop("Reward-model config overrides.")] = msgspec.field(
        default_factory=dict
    )
    fsdp_config: Annotated[dict[str, Any], noop("Reward-model FSDP settings.")] = msgspec.field(default_factory=dict)
    use_remove_padding: Annotated[bool, noop("Reward-model packing.")] = False
    use_fused_kernels: Annotated[bool, noop("Reward-model fused kernels.")] = False


class RewardModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """verl's older learned-reward-model section: ``enable`` and ``model.path`` are aliases of
    ``reward.reward_model``'s keys; two older spellings of ``reward.reward_kwargs``; the rest does nothing."""

    enable: Annotated[bool | None, doc("Alias of reward.reward_model.enable.")] = None
    reward_manager: Annotated[str, noop("verl reward manager (overlong shaping needs no 'dapo' manager here).")] = (
        "naive"
    )
    launch_reward_fn_async: Annotated[bool, noop("Score asynchronously (always the case here).")] = False
    strategy: Annotated[str, noop("Reward-model strategy.")] = "fsdp"
    model: Annotated[RewardModelModelAlias, doc("verl's reward-model settings (path: the model's directory).")] = (
        msgspec.field(default_factory=RewardModelModelAlias)
    )
    micro_batch_size: Annotated[int | None, noop("Reward-model micro-batch (see reward.reward_model).")] = None
    micro_batch_size_per_gpu: Annotated[
        int | None, noop("Reward-model micro-batch per GPU (see reward.reward_model.max_batch_sequences).")
    ] = None
    max_length: Annotated[int | None, noop("Reward-model max length (see reward.reward_model.max_length).")] = None
    use_dynamic_bsz: Annotated[bool, noop("Reward-model dynamic batch.")] = False
    forward_max_token_len_per_gpu: Annotated[int | None, noop("Reward-model token budget.")] = None
    sandbox_fusion: Annotated[dict[str, Any], noop("Sandbox settings.")] = msgspec.field(default_factory=dict)
    reward_kwargs: Annotated[
        RewardKwargsAlias, doc("verl's transitional spelling of reward.reward_kwargs (mapped onto it).")
    ] = msgspec.field(default_factory=RewardKwargsAlias)
    overlong_buffer: Annotated[
        OverlongBufferAlias,
        doc("The DAPO recipe's spelling of reward.reward_kwargs.overlong_buffer_cfg (mapped onto it)."),
    ] = msgspec.field(default_factory=OverlongBufferAlias)


__all__ = [
    "BUILTIN_DATA",
    "DEFAULT_REWARD_FUNCTION",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "OverlongBufferAlias",
    "OverlongBufferConfig",
    "RewardConfig",
    "RewardKwargsAlias",
    "RewardKwargsConfig",
    "RewardModelConfig",
    "RewardModelModelAlias",
    "RewardModelServeConfig",
]
