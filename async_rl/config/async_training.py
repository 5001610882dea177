"""The ``async_training`` section: this system's own asynchronous actor-learner settings (no verl equivalent).

Covers the staleness bound K (``max_staleness``), how weight updates reach actors mid-generation, the ZeroMQ rollout
plane (``transport``, with optional CURVE encryption, required off loopback), the learner->actor weight broadcast
(``weight_sync``), checkpointing, start-up/step/stop timeouts, per-actor generation settings and what
``launchers/local.py`` does when an actor fails (``launcher``).
"""

from typing import Annotated

import msgspec

from async_rl.config.fields import NonEmptyStr, NonNegFloat, NonNegInt, Port, PosFloat, PosInt, doc, noop
from async_rl.config.names import (
    ActorFailurePolicy,
    CpuAllocator,
    LogprobsMode,
    StalePolicy,
    UpdateMode,
    WeightSyncBackend,
)


class TransportConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The ZeroMQ rollout plane between the coordinator (learner rank 0) and the actors."""

    host: Annotated[
        NonEmptyStr, doc("Address the coordinator binds / actors connect to; non-loopback requires the curve_* keys.")
    ] = "127.0.0.1"
    port: Annotated[Port, doc("Coordinator ROUTER port (0 = pick a free port and announce it).")] = 0
    max_message_bytes: Annotated[
        int, doc("Largest accepted message; bigger frames are rejected (at least 1024).", ge=1024)
    ] = 256 * 2**20
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
    max_invalid_groups: Annotated[
        PosInt,
        doc(
            "An actor that delivers this many rollout groups failing validation (token ids outside the vocabulary,"
            " wrong completion count, too long, bad log-probs or versions) is quarantined: it gets no more work or"
            " weights and its groups are refused. Each invalid group's prompt is granted again."
        ),
    ] = 3
    curve_server_secret_key: Annotated[
        NonEmptyStr | None, doc("CURVE: coordinator secret-key file (null = no encryption).")
    ] = None
    curve_server_public_key: Annotated[
        NonEmptyStr | None, doc("CURVE: coordinator public-key file (actors need it).")
    ] = None
    curve_client_keys_dir: Annotated[NonEmptyStr | None, doc("CURVE: directory of authorised actor public keys.")] = (
        None
    )
    curve_client_secret_key: Annotated[NonEmptyStr | None, doc("CURVE: this actor's secret-key file.")] = None
    curve_client_public_key: Annotated[
        NonEmptyStr | None,
        doc(
            "CURVE: this actor's public-key file (the one the coordinator authorises); an actor refuses to start"
            " when it is not the public half of curve_client_secret_key."
        ),
    ] = None
    socket_hwm: Annotated[
        PosInt, doc("ZeroMQ send/receive high-water mark, in messages, of every socket of the rollout plane.")
    ] = 256
    max_actors: Annotated[PosInt, doc("The most actor identities the coordinator tracks at once.")] = 4096


class WeightSyncConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Learner -> actor weight broadcast after each policy update."""

    backend: Annotated[WeightSyncBackend, doc("Collective backend: 'auto' = nccl on CUDA, else gloo.")] = "auto"
    bucket_size_mb: Annotated[PosFloat, doc("Size of each broadcast bucket in MiB.")] = 256.0
    verify_rotation: Annotated[
        PosInt,
        doc(
            "Actors check after each update that the model holds what was received: every update, that each received"
            " tensor has a place and every fused part arrived; the values (read back, or probed through the layer's"
            " kernel where vLLM repacked the weight) of 1/N of the parameters per update, in turn, so each is checked"
            " at least every N updates, and all of them on the first update and after one that failed. 1 = every"
            " value on every update (on CPU about 0.2 s more per update of SmolLM2-135M: 0.29-0.32 s of checks vs"
            " 0.09 s)."
        ),
    ] = 4
    timeout_s: Annotated[
        PosFloat,
        doc(
            "Deadline of each collective step of a weight transfer (forming the group, each bucket's broadcast); on"
            " expiry the transfer fails, training goes on, and the group is re-formed from the actors still alive."
        ),
    ] = 60.0
    join_timeout_s: Annotated[
        PosFloat,
        doc(
            "Seconds the learner waits for invited actors to be ready for a new weight-sync epoch; one that is not is"
            " left out (it keeps its weights) until it announces itself again."
        ),
    ] = 10.0
    master_addr: Annotated[str, doc("Rendezvous address of the weight-sync group (learner rank 0's host).")] = (
        "127.0.0.1"
    )
    master_port: Annotated[Port, doc("Rendezvous port of the weight-sync group (0 = pick a free port).")] = 0
    served_check_tolerance: Annotated[
        PosFloat | None,
        doc(
            "LoRA runs: after each update every actor computes log-probs of a fixed probe sequence with the adapter it"
            " now serves and compares them with the learner's for that version; a mean |difference| above this stops"
            " it generating (loudly) until an update passes. null = 1e-3 when the rollout and the learner both compute"
            " in fp32 (rollout.dtype and actor.fsdp_config.mixed_precision.param_dtype as resolved), 3e-2 when one"
            " computes in bf16, 0.15 when both do."
        ),
    ] = None


class CheckpointConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Checkpointing (also reachable through verl's trainer.default_local_dir / save_freq)."""

    dir: Annotated[str | None, doc("Checkpoint directory; null = trainer.default_local_dir.")] = None
    save_every_n_steps: Annotated[PosInt | None, doc("Checkpoint period in steps; null = trainer.save_freq.")] = None
    keep_last: Annotated[PosInt | None, doc("Keep only the newest N checkpoints (null = keep all).")] = None
    save_hf: Annotated[
        bool,
        noop(
            "A Hugging Face model directory with each checkpoint; checkpoints hold FSDP state only, and the Hugging"
            " Face directory is written once, at the end of the run (final_hf/ in the run directory)."
        ),
    ] = False


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
    stop_s: Annotated[
        PosFloat,
        doc(
            "Seconds a learner rank has after SIGTERM to reach a step boundary, write a checkpoint (if checkpointing"
            " is configured) and exit; past it the rank exits at once without one. launchers/local.py's --grace-s"
            " (after which it kills the learner) defaults to this + 5 s, at least 15 s; keep Slurm's grace above it."
        ),
    ] = 10.0
    collective_s: Annotated[
        PosFloat,
        doc(
            "Seconds a collective of the learner group may wait (torch.distributed's process-group timeout): a rank"
            " that died or hangs turns the others' wait into an error instead of a hang."
        ),
    ] = 1800.0


class LauncherConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What ``launchers/local.py`` does when an actor process fails (the learner failing always ends the job)."""

    actor_failure: Annotated[
        ActorFailurePolicy,
        doc(
            "An actor exits non-zero (or is killed) and gets no restart: 'continue' = log it and go on while another"
            " actor is running or due a restart (its leases are granted again after transport.peer_timeout_s);"
            " 'stop' = stop the whole job. The last actor failing always stops the job."
        ),
    ] = "continue"
    restart_actors: Annotated[bool, doc("Restart a failed actor (same actor id, GPUs and log file, appended).")] = False
    max_actor_restarts: Annotated[
        NonNegInt, doc("Restarts allowed per actor over the whole run; then actor_failure decides.")
    ] = 3
    restart_backoff_s: Annotated[
        NonNegFloat, doc("Seconds before an actor's first restart; doubled before each further restart of it.")
    ] = 5.0
    max_reward_server_restarts: Annotated[
        NonNegInt,
        doc(
            "Restarts allowed for the reward server (reward.reward_model.placement: server) over the whole run, after"
            " restart_backoff_s (doubled each time); then the job stops, as it cannot be scored without it."
        ),
    ] = 3


class ActorSettingsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per-actor generation settings."""

    max_concurrent_groups: Annotated[
        PosInt,
        doc(
            "Training prompt groups one actor generates concurrently. A validation round's prompts have a cap of"
            " their own, as many samples: max_concurrent_groups x rollout.n / rollout.val_kwargs.n prompts."
        ),
    ] = 64
    lend_learner_cores: Annotated[
        bool,
        doc(
            "CPU, one actor on the learner's host: bind its vLLM threads to every core the actor process may use, run"
            " on all but one of them (vLLM's own share), and on all of them while the learner waits for the actors"
            " (for groups or a validation round), when the learner's cores would idle. Nothing on a GPU, or when"
            " VLLM_CPU_OMP_THREADS_BIND is set (then that binding holds). With it the learner also waits for a"
            " validation round to end before it publishes a newer version, lending its cores to the round, instead of"
            " the actors holding newer versions back while the learner goes on beside the round (slower on shared"
            " cores: docs/recipes.md)."
        ),
    ] = False
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
    cpu_allocator: Annotated[
        CpuAllocator,
        doc(
            "C allocator of the learner ranks and the actors (their vLLM engines inherit it): 'auto' = tcmalloc when"
            " a libtcmalloc is found (the entry point re-runs itself with LD_PRELOAD), else the system malloc with a"
            " warning; 'tcmalloc' = an error when none is found; 'system' = leave LD_PRELOAD alone."
        ),
    ] = "auto"
    transport: Annotated[TransportConfig, doc("Rollout plane.")] = msgspec.field(default_factory=TransportConfig)
    weight_sync: Annotated[WeightSyncConfig, doc("Weight broadcast.")] = msgspec.field(default_factory=WeightSyncConfig)
    checkpoint: Annotated[CheckpointConfig, doc("Checkpointing.")] = msgspec.field(default_factory=CheckpointConfig)
    timeouts: Annotated[TimeoutsConfig, doc("Deadlines.")] = msgspec.field(default_factory=TimeoutsConfig)
    actor: Annotated[ActorSettingsConfig, doc("Per-actor settings.")] = msgspec.field(
        default_factory=ActorSettingsConfig
    )
    launcher: Annotated[LauncherConfig, doc("Actor failures under launchers/local.py.")] = msgspec.field(
        default_factory=LauncherConfig
    )


__all__ = [
    "ActorSettingsConfig",
    "AsyncTrainingConfig",
    "CheckpointConfig",
    "LauncherConfig",
    "TimeoutsConfig",
    "TransportConfig",
    "WeightSyncConfig",
]
