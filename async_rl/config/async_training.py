"""The ``async_training`` section: this system's own asynchronous actor-learner settings (no verl equivalent).

Covers the staleness bound K (``max_staleness``), how weight updates reach actors mid-generation, the ZeroMQ rollout
plane (``transport``, with optional CURVE encryption, required off loopback), the learner->actor weight broadcast
(``weight_sync``), checkpointing, start-up/step timeouts and per-actor generation settings.
"""

from typing import Annotated

import msgspec

from async_rl.config.fields import NonNegInt, Port, PosFloat, PosInt, doc
from async_rl.config.names import LogprobsMode, StalePolicy, UpdateMode, WeightSyncBackend


class TransportConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The ZeroMQ rollout plane between the coordinator (learner rank 0) and the actors."""

    host: Annotated[
        str, doc("Address the coordinator binds / actors connect to; non-loopback requires the curve_* keys.")
    ] = "127.0.0.1"
    port: Annotated[Port, doc("Coordinator ROUTER port (0 = pick a free port and announce it).")] = 0
    max_message_bytes: Annotated[PosInt, doc("Largest accepted message; bigger frames are rejected.")] = 256 * 2**20
    max_inflight_groups: Annotated[
        PosInt | None,
        doc(
            "Cap on leased + buffered groups; null = (max_staleness + 1) x groups per step. Admission also never "
            "grants a prompt that would queue past the staleness bound (see transport/admission.py)."
        ),
    ] = None
    heartbeat_interval_s: Annotated[PosFloat, doc("Seconds between heartbeats.")] = 2.0
    peer_timeout_s: Annotated[PosFloat, doc("A peer silent this long is considered gone (> heartbeat interval).")] = (
        30.0
    )
    lease_timeout_s: Annotated[PosFloat, doc("A granted prompt not returned within this is re-granted.")] = 600.0
    curve_server_secret_key: Annotated[
        str | None, doc("CURVE: coordinator secret-key file (null = no encryption).")
    ] = None
    curve_server_public_key: Annotated[str | None, doc("CURVE: coordinator public-key file (actors need it).")] = None
    curve_client_keys_dir: Annotated[str | None, doc("CURVE: directory of authorised actor public keys.")] = None
    curve_client_secret_key: Annotated[str | None, doc("CURVE: this actor's secret-key file.")] = None
    curve_client_public_key: Annotated[str | None, doc("CURVE: this actor's public-key file.")] = None


class WeightSyncConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Learner -> actor weight broadcast after each policy update."""

    backend: Annotated[WeightSyncBackend, doc("Collective backend: 'auto' = nccl on CUDA, else gloo.")] = "auto"
    bucket_size_mb: Annotated[PosFloat, doc("Size of each broadcast bucket in MiB.")] = 256.0
    timeout_s: Annotated[PosFloat, doc("A weight transfer taking longer fails the run instead of hanging.")] = 600.0
    master_addr: Annotated[str, doc("Rendezvous address of the weight-sync group (learner rank 0's host).")] = (
        "127.0.0.1"
    )
    master_port: Annotated[Port, doc("Rendezvous port of the weight-sync group (0 = pick a free port).")] = 0


class CheckpointConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Checkpointing (also reachable through verl's trainer.default_local_dir / save_freq)."""

    dir: Annotated[str | None, doc("Checkpoint directory; null = trainer.default_local_dir.")] = None
    save_every_n_steps: Annotated[PosInt | None, doc("Checkpoint period in steps; null = trainer.save_freq.")] = None
    keep_last: Annotated[PosInt | None, doc("Keep only the newest N checkpoints (null = keep all).")] = None
    save_hf: Annotated[bool, doc("Also write a Hugging Face model directory with each checkpoint.")] = False


class TimeoutsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Deadlines that turn a hang into a clear failure."""

    actor_start_s: Annotated[PosFloat, doc("Seconds for actors to start and register.")] = 600.0
    step_s: Annotated[PosFloat, doc("Seconds one training step (including waiting for rollouts) may take.")] = 1800.0
    validation_s: Annotated[
        PosFloat,
        doc(
            "Seconds the learner waits, before its next weight publish, for an open validation round to finish;"
            " then it logs the partial results with a warning and goes on."
        ),
    ] = 1800.0


class ActorSettingsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per-actor generation settings."""

    max_concurrent_groups: Annotated[PosInt, doc("Prompt groups one actor generates concurrently.")] = 64
    logprobs_mode: Annotated[
        LogprobsMode,
        doc(
            "Which distribution the behaviour log-probs refer to: 'processed' = after temperature/top-p/top-k (the"
            " distribution actually sampled; default, keeps IS ratios correct); 'raw' = the model's unmodified logits."
        ),
    ] = "processed"


class AsyncTrainingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Asynchronous actor-learner settings."""

    num_actors: Annotated[
        PosInt, doc("vLLM actor processes (each uses rollout.tensor_model_parallel_size devices).")
    ] = 1
    max_staleness: Annotated[
        NonNegInt, doc("K: a group started under policy v is trained at version s only if s - v <= K (0 = on-policy).")
    ] = 1
    update_mode: Annotated[
        UpdateMode, doc("'inflight' = actors load new weights mid-generation; 'drain' = finish current groups first.")
    ] = "inflight"
    stale_policy: Annotated[StalePolicy, doc("Groups over the staleness bound are 'drop'ped or 'regrant'ed.")] = "drop"
    sync_every_n_steps: Annotated[PosInt, doc("Broadcast weights to actors every this many learner steps.")] = 1
    transport: Annotated[TransportConfig, doc("Rollout plane.")] = msgspec.field(default_factory=TransportConfig)
    weight_sync: Annotated[WeightSyncConfig, doc("Weight broadcast.")] = msgspec.field(default_factory=WeightSyncConfig)
    checkpoint: Annotated[CheckpointConfig, doc("Checkpointing.")] = msgspec.field(default_factory=CheckpointConfig)
    timeouts: Annotated[TimeoutsConfig, doc("Deadlines.")] = msgspec.field(default_factory=TimeoutsConfig)
    actor: Annotated[ActorSettingsConfig, doc("Per-actor settings.")] = msgspec.field(
        default_factory=ActorSettingsConfig
    )


__all__ = [
    "ActorSettingsConfig",
    "AsyncTrainingConfig",
    "CheckpointConfig",
    "TimeoutsConfig",
    "TransportConfig",
    "WeightSyncConfig",
]
