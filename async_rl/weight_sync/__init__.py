"""Learner -> actor weight broadcast: NCCL on GPU, gloo on CPU, same code, with digest and load verification.

Learner rank 0: ``open_group(..., rank=0)`` then ``WeightSender(group, bucket_size_mb=b).send(named_tensors, version=v,
manifest=specs)``.
Actor: build ``vllm.LLM(**vllm_engine_kwargs(), ...)``, then ``EngineWeightSync(llm, verify_rotation=N).join(...)`` once
and ``.update(version=v)`` per update. ``async_rl.actor.vllm_ext`` (imported only inside vLLM workers) holds the engine
registered with vLLM's weight-transfer registry; this package never imports vLLM or a role.
"""

from async_rl.weight_sync.buckets import Bucket, TensorAssembler, fill_buckets, plan_buckets
from async_rl.weight_sync.client import AsyncEngineWeightSync, EngineWeightSync, vllm_engine_kwargs
from async_rl.weight_sync.digest import TensorDigest, compare_digests, digest_tensor, fingerprint
from async_rl.weight_sync.errors import WeightMismatchError, WeightSyncError, WeightSyncTimeout
from async_rl.weight_sync.group import WeightSyncGroup, create_store, open_group, resolve_backend
from async_rl.weight_sync.receiver import ReceiveReport, WeightReceiver
from async_rl.weight_sync.sender import SendReport, WeightSender
from async_rl.weight_sync.verify import LoadVerifier, VerifyReport

__all__ = [
    "AsyncEngineWeightSync",
    "Bucket",
    "EngineWeightSync",
    "LoadVerifier",
    "ReceiveReport",
    "SendReport",
    "TensorAssembler",
    "TensorDigest",
    "VerifyReport",
    "WeightReceiver",
    "WeightSender",
    "WeightMismatchError",
    "WeightSyncError",
    "WeightSyncGroup",
    "WeightSyncTimeout",
    "compare_digests",
    "create_store",
    "digest_tensor",
    "fill_buckets",
    "fingerprint",
    "open_group",
    "plan_buckets",
    "resolve_backend",
    "vllm_engine_kwargs",
]
