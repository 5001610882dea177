"""The rollout plane's wire messages: typed, versioned msgspec structs encoded as msgpack.

Every message is one member of a tagged union (``kind`` names it) and carries ``protocol`` (checked on decode by
``codec.WireCodec``) and ``ts``, its creation time. Token ids and log-probs travel as `WireArray`: raw little-endian
bytes plus dtype and length, never as msgpack lists of numbers, and decode to numpy without a copy.

All structs are ``gc=False``: messages are trees (never reference cycles), so the cyclic garbage collector need not
track them. That matters in the learner process, which holds millions of objects: every tracked allocation brings
the next full collection closer, and a group decodes into dozens of objects.

Flow: actor -> coordinator: Hello, WorkRequest, RolloutGroup, Heartbeat, Bye.
      coordinator -> actor: Welcome, WorkGrant, GroupAck, Heartbeat, VersionUpdate, Shutdown.

The learner's weight-sync plan (`WeightSyncPlan`) rides on Welcome and VersionUpdate: it is built once by the
publisher (``weight_sync.publisher``), validated when the actor decodes it, and read as typed fields from there on,
down to the vLLM worker that joins the group (``weight_sync.membership.JoinInfo``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
import numpy as np

from async_rl.config.names import MAX_NAME_LENGTH, VLLM_MAX_LORA_RANK

if TYPE_CHECKING:
    from async_rl.config import Config

PROTOCOL_VERSION = 1

# dtypes accepted on the wire, as numpy little-endian type strings.
TOKEN_DTYPES: frozenset[str] = frozenset({"<i4", "<i8", "<u4"})
FLOAT_DTYPES: frozenset[str] = frozenset({"<f2", "<f4", "<f8"})
MASK_DTYPES: frozenset[str] = frozenset({"|u1"})  # one byte per token: byte order does not apply
ALLOWED_DTYPES: frozenset[str] = TOKEN_DTYPES | FLOAT_DTYPES | MASK_DTYPES

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
# Actor ids double as zmq routing ids: non-empty, printable ASCII, no leading NUL (reserved by zmq).
ActorId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[!-~]+$")]
ShortStr = Annotated[str, msgspec.Meta(max_length=256)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0.0)]
SyncBackend = Literal["gloo", "nccl"]  # the weight-sync group's backend, resolved ("auto" never travels)
# A validation round id (see transport.evaluation); -1 marks training work.
EvalRoundId = Annotated[int, msgspec.Meta(ge=-1)]
NO_EVAL = -1
# "invalid": the group failed validation (transport.validation) or its sender is quarantined; like every status,
# final (the actor stops re-sending it), and the prompt is granted again.
AckStatus = Literal["accepted", "duplicate", "stale", "unknown", "invalid"]
ACK_STATUSES: tuple[str, ...] = ("accepted", "duplicate", "stale", "unknown", "invalid")


class WireArray(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """A 1-D numeric array as raw little-endian bytes; ``len(data) == length * itemsize(dtype)`` is enforced on decode.

    ``data`` is a memoryview so decoding references the received buffer instead of copying it.
    """

    data: memoryview
    dtype: str
    length: NonNegInt


class GroupSampling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """How one prompt group is sampled: ``n`` completions of at most ``max_tokens`` tokens each.

    The one sampling type of the system: the coordinator grants it (``PromptGrant.sampling``), the actor's engine
    takes it as is (``GenerationEngine.generate``, which maps it onto vLLM's own ``SamplingParams``), and the
    coordinator checks delivered groups against it. Every field is required: the values come from the config
    (:meth:`from_config` for training, :meth:`for_validation` for validation rounds) or, in tests and tools, from the
    config's defaults with a few changes (:meth:`defaults`). Constraints are checked on decode (``checked``).
    """

    n: PositiveInt
    temperature: Annotated[float, msgspec.Meta(ge=0.0)]
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
    top_k: Annotated[int, msgspec.Meta(ge=-1)]  # -1 (or 0): off
    max_tokens: PositiveInt
    seed: NonNegInt | None  # vLLM seeds sample i with seed + i; None: unseeded

    @classmethod
    def from_config(cls, cfg: Config, *, seed: int | None) -> GroupSampling:
        """Training sampling: ``actor_rollout_ref.rollout.{n, temperature, top_p, top_k}``, at most
        ``data.max_response_length`` tokens."""
        r = cfg.actor_rollout_ref.rollout
        return cls(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_tokens=cfg.data.max_response_length,
            seed=seed,
        )

    @classmethod
    def for_validation(cls, cfg: Config, *, seed: int | None) -> GroupSampling:
        """Validation sampling from ``actor_rollout_ref.rollout.val_kwargs``, as verl: ``do_sample=false`` decodes
        greedily (temperature 0, one sample per prompt, no seed needed); otherwise ``n`` samples with its
        temperature/top-p/top-k. At most ``data.max_response_length`` tokens either way."""
        vk = cfg.actor_rollout_ref.rollout.val_kwargs
        max_tokens = cfg.data.max_response_length
        if not vk.do_sample:
            return cls(n=1, temperature=0.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, seed=None)
        return cls(n=vk.n, temperature=vk.temperature, top_p=vk.top_p, top_k=vk.top_k, max_tokens=max_tokens, seed=seed)

    @classmethod
    def defaults(cls, **overrides: Any) -> GroupSampling:
        """The config's default training sampling (unseeded), with ``overrides`` replaced; for tests and tools."""
        from async_rl.config import default_config

        return msgspec.structs.replace(cls.from_config(default_config(), seed=None), **overrides)


SEED_MODULUS = 2**31


def group_seed(base_seed: int, index: int, n: int, stream: int = 0) -> int:
    """The request seed of prompt ``index``: vLLM seeds its i-th sample with ``seed + i``, so each prompt gets its own
    block of ``n`` consecutive seeds and no two samples of a run share a random stream (prompt ``p``'s sample ``i`` and
    prompt ``p+1``'s sample ``i-1`` would, with ``seed + p``). ``base_seed`` and ``stream`` (training 0, evaluation
    rounds 1, 2, ...) pick a pseudo-random start, so runs with neighbouring seeds do not share streams either.
    Distinct for every ``index < SEED_MODULUS // n``."""
    start = (base_seed * 0x9E3779B1 + stream * 0x85EBCA77) % SEED_MODULUS
    return (start + index * n) % SEED_MODULUS


class PromptGrant(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One leased prompt: generate ``sampling.n`` completions with a policy of version >= ``min_version``.

    An eval grant (``eval_round >= 0``) belongs to a validation round instead of training: ``prompt_id`` is the
    prompt's index in that round, and it must run under EXACTLY ``min_version`` (see transport.evaluation).
    """

    prompt_id: NonNegInt
    lease_id: PositiveInt
    min_version: NonNegInt
    prompt_token_ids: WireArray
    sampling: GroupSampling
    extras: dict[str, Any] = {}
    eval_round: EvalRoundId = NO_EVAL

    @property
    def is_eval(self) -> bool:
        return self.eval_round >= 0


class TurnSpan(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """One assistant turn of a multi-turn completion: where its sampled tokens sit in ``token_ids``."""

    start: NonNegInt  # offset of the turn's first sampled token in token_ids
    length: NonNegInt  # number of sampled tokens of this turn (contiguous)
    version_min: NonNegInt
    version_max: NonNegInt
    finish_reason: Annotated[str, msgspec.Meta(max_length=64)]
    reward: float = 0.0  # per-turn reward (0 when the environment gives only a final one)


class EpisodeStats(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """What a multi-turn episode did besides its tokens (the ``rollout/tool_*`` and template metrics)."""

    tool_calls: NonNegInt  # tool calls the environment executed (or tried to)
    tool_errors: NonNegInt  # calls that failed: unparseable, unknown tool, bad arguments, error, timeout
    template_mismatch: bool  # the whole conversation, rendered at once, gave other text (ChatRenderer.check)
    retokenization_drift: bool = False  # same text, other tokens: re-encoding would not give what was sampled


class Completion(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One completion: its tokens, the behaviour log-prob of each, and the policy versions it spans.

    Single-turn, every token was sampled by the model. A multi-turn episode is one growing sequence after the
    prompt: the model's sampled tokens interleaved with observation tokens (tool responses, chat-template glue) it
    did not sample. ``loss_mask`` (dtype ``|u1``, one entry per token) is 1 on sampled tokens and 0 on observation
    ones, whose behaviour log-probs are 0 by convention; ``turns`` says where each assistant turn's sampled tokens
    sit. Both None: every token sampled. The learner trains on sampled tokens only; transport.validation checks the
    mask, the turns and the versions agree.
    """

    token_ids: WireArray
    logprobs: WireArray
    version_min: NonNegInt
    version_max: NonNegInt
    finish_reason: Annotated[str, msgspec.Meta(max_length=64)]
    reward: float
    reward_components: dict[Annotated[str, msgspec.Meta(max_length=MAX_NAME_LENGTH)], float] | None = None
    loss_mask: WireArray | None = None  # None: every token sampled (single-turn)
    turns: list[TurnSpan] | None = None  # None: not told (single-turn)
    episode: EpisodeStats | None = None  # multi-turn only
    # on-policy distillation: the teacher's log-prob of each token (0 on observation tokens), float; None: not scored
    teacher_logprobs: WireArray | None = None


class AdapterPlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """A LoRA run's adapter, as the learner built it: each version's update carries only its tensors (under PEFT's
    names), and an actor loads each version into vLLM as its own adapter ``v<version>``."""

    rank: Annotated[int, msgspec.Meta(ge=1, le=VLLM_MAX_LORA_RANK)]
    alpha: PositiveFloat
    target_modules: Annotated[
        tuple[Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_LENGTH)], ...], msgspec.Meta(min_length=1)
    ]


class ServedCheck(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """What the learner's weights of a version compute on a fixed probe sequence: ``logprobs[i]`` is
    log p(``token_ids[i + 1]`` | ``token_ids[: i + 1]``) at temperature 1. An actor that loaded the version computes
    the same with what it serves; a mean |difference| above ``tolerance`` means the update did not take effect."""

    token_ids: Annotated[tuple[NonNegInt, ...], msgspec.Meta(min_length=2, max_length=256)]
    logprobs: Annotated[tuple[float, ...], msgspec.Meta(min_length=1, max_length=255)]
    tolerance: PositiveFloat


class WeightSyncPlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """The learner's weight-sync plan for one version: where rank 0's TCPStore is, and who is invited to the epoch.

    Every field but ``adapter`` is required: the publisher fills each one from its settings, and nothing downstream
    applies a default. An actor not in ``candidates`` announces itself at ``host:port`` (``weight_sync.membership``);
    one in ``candidates`` joins epoch ``epoch`` and receives ``version``. Before the first epoch the plan has
    ``version`` and ``epoch`` -1 and no candidates: it only tells actors where to announce themselves.
    """

    host: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)]
    backend: SyncBackend
    timeout_s: PositiveFloat  # bound on each collective of the group (one bucket)
    join_timeout_s: PositiveFloat  # how long rank 0 waits for the candidates to be ready
    version: Annotated[int, msgspec.Meta(ge=-1)]  # the policy version this plan announces; -1: none yet
    epoch: Annotated[int, msgspec.Meta(ge=-1)]  # the group's epoch (a new one each time membership changes)
    candidates: tuple[ActorId, ...]  # the actors invited to ``epoch``
    adapter: AdapterPlan | None = None  # LoRA: what each update carries; None: the full weights
    served_check: ServedCheck | None = None  # LoRA: what ``version`` computes on the probe (actors check it)


class Message(msgspec.Struct, tag_field="kind", forbid_unknown_fields=True, kw_only=True, gc=False):
    """Base of every wire message: protocol version and creation time (stamped per instance, not at import)."""

    protocol: NonNegInt = PROTOCOL_VERSION
    ts: float = msgspec.field(default_factory=time.time)


class Hello(Message, tag="hello"):
    actor_id: ActorId
    loaded_version: NonNegInt = 0


class Welcome(Message, tag="welcome"):
    policy_version: NonNegInt
    min_version: NonNegInt
    max_staleness: NonNegInt
    heartbeat_interval_s: float
    peer_timeout_s: float
    lease_timeout_s: float
    max_message_bytes: PositiveInt
    weight_sync: WeightSyncPlan | None = None  # None: the learner publishes no weights (tests, benchmarks)


class WorkRequest(Message, tag="work_request"):
    """Credit: the actor can take ``max_groups`` more groups, counting from the ``grants_seen``-th granted prompt."""

    actor_id: ActorId
    max_groups: NonNegInt
    loaded_version: NonNegInt
    grants_seen: NonNegInt = 0


class WorkGrant(Message, tag="work_grant"):
    prompts: list[PromptGrant]
    policy_version: NonNegInt


class RolloutGroup(Message, tag="rollout_group"):
    """The n completions of one prompt, delivered under the lease that granted it."""

    prompt_id: NonNegInt
    lease_id: PositiveInt
    actor_id: ActorId
    completions: list[Completion]
    timings: dict[Annotated[str, msgspec.Meta(max_length=MAX_NAME_LENGTH)], float] = {}
    eval_round: EvalRoundId = NO_EVAL  # the grant's eval_round: eval groups go to their round, never to training

    @property
    def version(self) -> int:
        """The group's generation version: the OLDEST version any of its completions used."""
        return min(c.version_min for c in self.completions)

    @property
    def newest_version(self) -> int:
        return max(c.version_max for c in self.completions)

    @property
    def version_span(self) -> int:
        return self.newest_version - self.version


class AckEntry(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """The coordinator's verdict on one delivered group."""

    prompt_id: NonNegInt
    lease_id: PositiveInt
    status: AckStatus
    eval_round: EvalRoundId = NO_EVAL  # eval and training lease ids are separate spaces: this tells them apart


class GroupAck(Message, tag="group_ack"):
    """Acknowledges each delivered group individually; acks for one actor are batched per coordinator loop pass."""

    acks: list[AckEntry]


class Heartbeat(Message, tag="heartbeat"):
    sender: ActorId
    policy_version: NonNegInt = 0
    # Actor -> coordinator only: cumulative counters since the actor started (see transport.metrics.ACTOR_REPORT_KEYS).
    stats: dict[str, float] = {}
    # Coordinator -> actors only: the learner is blocked waiting for the actors (for groups, or a validation round);
    # sent at once when it changes, and on every heartbeat
    learner_waiting: bool = False
    # Coordinator -> actors only: the policy version of the open validation round while some of its prompts are still
    # to be granted (-1: none); an actor on that version holds back a newer one until its part of the round is done
    # (actor.loop). Sent at once when it changes.
    eval_version: int = -1


class VersionUpdate(Message, tag="version_update"):
    policy_version: NonNegInt
    min_version: NonNegInt
    weight_sync: WeightSyncPlan | None = None  # the plan for this version (None: unchanged)


class Shutdown(Message, tag="shutdown"):
    reason: ShortStr = ""


class Bye(Message, tag="bye"):
    actor_id: ActorId


AnyMessage = (
    Hello | Welcome | WorkRequest | WorkGrant | RolloutGroup | GroupAck | Heartbeat | VersionUpdate | Shutdown | Bye
)


S = TypeVar("S", bound=msgspec.Struct)


def checked(struct: S) -> S:
    """``struct`` validated against its own schema (msgspec checks constraints when decoding, not when a struct is
    built in Python); raises ValueError naming the bad field."""
    try:
        return msgspec.msgpack.decode(msgspec.msgpack.encode(struct), type=type(struct))
    except msgspec.ValidationError as exc:
        raise ValueError(f"{type(struct).__name__}: {exc}") from None


def pack_array(values: np.ndarray | list[int] | list[float], dtype: str) -> WireArray:
    """Wrap a 1-D array as a WireArray of ``dtype`` (converted to little-endian; no copy when already so)."""
    if dtype not in ALLOWED_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not allowed on the wire; allowed: {sorted(ALLOWED_DTYPES)}")
    arr = np.ascontiguousarray(np.asarray(values, dtype=np.dtype(dtype)))
    if arr.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {arr.shape}")
    return WireArray(data=arr.data.cast("B"), dtype=dtype, length=int(arr.shape[0]))


def unpack_array(wire: WireArray) -> np.ndarray:
    """A read-only numpy view of the wire bytes (zero-copy); the length is checked here too."""
    dtype = np.dtype(wire.dtype)
    if len(wire.data) != wire.length * dtype.itemsize:
        raise ValueError(f"array byte length {len(wire.data)} != length {wire.length} x itemsize {dtype.itemsize}")
    return np.frombuffer(wire.data, dtype=dtype, count=wire.length)


def make_completion(
    token_ids: np.ndarray | list[int],
    logprobs: np.ndarray | list[float],
    *,
    version_min: int,
    version_max: int | None = None,
    finish_reason: str = "stop",
    reward: float = 0.0,
    reward_components: dict[str, float] | None = None,
    token_dtype: str = "<i4",
    logprob_dtype: str = "<f4",
    loss_mask: np.ndarray | list[int] | None = None,
    turns: list[TurnSpan] | None = None,
    episode: EpisodeStats | None = None,
    teacher_logprobs: np.ndarray | list[float] | None = None,
) -> Completion:
    """Build a Completion from arrays; one behaviour log-prob per token is required, and one ``loss_mask`` entry and
    one teacher log-prob per token when given (mask 1: sampled, 0: observation). Whether the mask and ``turns`` agree
    is transport.validation's to judge, as for a completion an actor sent."""
    tokens = pack_array(token_ids, token_dtype)
    lps = pack_array(logprobs, logprob_dtype)
    if tokens.length != lps.length:
        raise ValueError(f"logprobs length {lps.length} != token_ids length {tokens.length}")
    teacher = None if teacher_logprobs is None else pack_array(teacher_logprobs, logprob_dtype)
    if teacher is not None and teacher.length != tokens.length:
        raise ValueError(f"teacher_logprobs length {teacher.length} != token_ids length {tokens.length}")
    mask = None if loss_mask is None else pack_array(loss_mask, "|u1")
    if mask is not None and mask.length != tokens.length:
        raise ValueError(f"loss_mask length {mask.length} != token_ids length {tokens.length}")
    vmax = version_min if version_max is None else version_max
    if vmax < version_min:
        raise ValueError(f"version_max {vmax} < version_min {version_min}")
    return Completion(
        token_ids=tokens,
        logprobs=lps,
        version_min=version_min,
        version_max=vmax,
        finish_reason=finish_reason,
        reward=float(reward),
        reward_components=reward_components,
        loss_mask=mask,
        turns=None if turns is None else list(turns),
        episode=episode,
        teacher_logprobs=teacher,
    )
