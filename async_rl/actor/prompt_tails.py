"""A vLLM scheduler whose requests share the last, partly filled KV block of a prompt they have in common.

vLLM's prefix cache shares only full blocks. A GRPO group sends n requests with the same prompt, so each of them
prefilled the prompt's last partial block again: for the SmolLM2 recipes' 46-token prompt and 32-token blocks, 14 of
46 tokens per sample, about 28% of a CPU actor's generation round (docs/architecture.md, "The actor").

:class:`PromptTailScheduler` lets the first request of such a prompt (the tail's *owner*) compute the partial block,
and the others wait one scheduler step, then take the owner's block as a prefix-cache hit that ends inside it. From
there vLLM's own copy-on-write path for sub-block hits does the rest: the request gets a private block, the worker
copies the owner's block into it before the step's forward (``kv_cache_block_copies``), and the request computes
only the prompt's last token, whose logits it samples from. The owner's later tokens, copied along, are overwritten
as the request writes its own.

A request shares a tail only with a live owner of the same prompt tokens, LoRA adapter and ``cache_salt`` (the actor
salts every request with its policy version, so no KV computed under other weights is shared, as for full blocks),
whose prompt was computed in an earlier step. The owner is forgotten when it finishes or is preempted; then the next
request of that prompt computes the tail itself and owns it.

It is the CPU engines' scheduler (``actor/engine.py``, ``PROMPT_TAIL_SCHEDULER``): vLLM's CPU platform schedules
synchronously anyway, while a GPU engine would lose its asynchronous scheduling to a subclass, for a prefill it does
in a fraction of a step. Engines with a KV connector, more than one KV-cache group, or prefix caching off schedule
as vLLM does.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.request import Request, RequestStatus

logger = logging.getLogger(__name__)

__all__ = ["PromptTailScheduler"]

_TailKey = tuple[Any, int, tuple[int, ...]]


class PromptTailScheduler(Scheduler):
    """vLLM's scheduler, with a prompt's partial last block computed once per group (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        groups = self.kv_cache_config.kv_cache_groups
        self.shares_tails = (
            self.cache_config.enable_prefix_caching
            and self.connector is None
            and len(groups) == 1
            and type(groups[0].kv_cache_spec) is FullAttentionSpec
        )
        self._owners: dict[_TailKey, str] = {}  # prompt -> the request that computes its tail
        self._owned: dict[str, _TailKey] = {}  # and back
        self._waiting_for_owner: set[str] = set()  # requests to skip for one step
        if not self.shares_tails:
            logger.info("prompt tails: not shared (prefix caching off, a KV connector, or a hybrid KV cache)")

    def _get_local_prefix_cache_hit(self, request: Request) -> tuple[KVCacheBlocks, int, int, bool]:
        hit = super()._get_local_prefix_cache_hit(request)
        blocks, num_local, boundary, diverged = hit
        prompt_len = request.num_prompt_tokens
        full = prompt_len - prompt_len % self.block_size
        if (
            not self.shares_tails
            or diverged
            or prompt_len - full < 2  # no tail, or one token: the request computes the last prompt token anyway
            or num_local != full  # the full blocks are not all cached (yet)
            or request.num_tokens != prompt_len  # resumed after preemption, with output tokens
            or request.prompt_token_ids is None
            or request.prompt_embeds is not None
            or request.mm_features
            or request.skip_reading_prefix_cache
        ):
            return hit
        key = _tail_key(request)
        owner = self.requests.get(self._owners.get(key, ""))
        if owner is None or owner is request or owner.status != RequestStatus.RUNNING:
            self._own(key, request.request_id)
            return hit
        if owner.num_computed_tokens < prompt_len:  # the owner computes the prompt in this step
            self._waiting_for_owner.add(request.request_id)
            return hit
        manager = self.kv_cache_manager.coordinator.single_type_managers[0]
        tail = manager.req_to_blocks[owner.request_id][full // self.block_size]
        return KVCacheBlocks((list(blocks.blocks[0]) + [tail],)), prompt_len - 1, boundary, False

    def _ec_transfer_pending(self, request: Request, num_computed_tokens: int) -> bool:
        # vLLM skips a waiting request for this step when this is true; here also when it waits for its tail's owner
        if request.request_id in self._waiting_for_owner:
            self._waiting_for_owner.discard(request.request_id)
            return True
        return super()._ec_transfer_pending(request, num_computed_tokens)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        self._disown(request.request_id)
        self._waiting_for_owner.discard(request.request_id)
        return super()._free_request(request, delay_free_blocks)

    def _own(self, key: _TailKey, request_id: str) -> None:
        previous = self._owners.get(key)
        if previous is not None:
            self._owned.pop(previous, None)
        self._owners[key] = request_id
        self._owned[request_id] = key

    def _disown(self, request_id: str) -> None:
        key = self._owned.pop(request_id, None)
        if key is not None and self._owners.get(key) == request_id:
            del self._owners[key]


def _tail_key(request: Request) -> _TailKey:
    lora = request.lora_request.lora_int_id if request.lora_request is not None else 0
    assert request.prompt_token_ids is not None
    return (request.cache_salt, lora, tuple(request.prompt_token_ids))
