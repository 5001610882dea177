"""The rollout plane: how actors and the learner talk (torch-free: numpy, msgspec, pyzmq).

protocol     typed, versioned msgpack messages; token ids / log-probs as raw little-endian arrays
codec        strict decoding (every bad message is a ProtocolError with a reason) and size-checked encoding
sockets      ROUTER/DEALER construction, loopback-by-default binding, CURVE + ZAP
keys         ``python -m async_rl.transport.keys DIR`` makes CURVE key pairs
ledger       exactly-once accounting of every prompt id (leases, re-grants, buffer, trained, filtered), save/restore
admission    the staleness bound and admission control (K = 0 is synchronous)
filtering    DAPO dynamic sampling: training groups with a constant metric are settled as filtered, not trained
coordinator  the background thread beside learner rank 0, and the learner's in-process API
evaluation   validation rounds pinned to one policy version, kept out of the ledger and of training
client       RolloutClient, used by actor processes
"""

from async_rl.transport.admission import min_start_version, within_bound
from async_rl.transport.client import RolloutClient
from async_rl.transport.codec import MessageTooLarge, ProtocolError, WireCodec, WireLimits
from async_rl.transport.coordinator import Coordinator
from async_rl.transport.filtering import FilterBudgetExceeded
from async_rl.transport.prompts import PromptRecord
from async_rl.transport.protocol import (
    PROTOCOL_VERSION,
    Completion,
    EpisodeStats,
    GroupSampling,
    PromptGrant,
    RolloutGroup,
    TurnSpan,
    make_completion,
    pack_array,
    unpack_array,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Completion",
    "Coordinator",
    "FilterBudgetExceeded",
    "GroupSampling",
    "MessageTooLarge",
    "PromptGrant",
    "PromptRecord",
    "ProtocolError",
    "RolloutClient",
    "RolloutGroup",
    "TurnSpan",
    "EpisodeStats",
    "WireCodec",
    "WireLimits",
    "make_completion",
    "min_start_version",
    "pack_array",
    "unpack_array",
    "within_bound",
]
