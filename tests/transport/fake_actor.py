"""A fake actor process for the transport tests: a real RolloutClient whose "generation" is a sleep.

Run as ``python tests/transport/fake_actor.py --address tcp://127.0.0.1:PORT --actor-id a0 ...`` with the repository
root on PYTHONPATH. Each completion's tokens are the prompt's tokens reversed followed by the completion index, so
the learner side can check that every group carries the data of the prompt it claims. New policy versions are
"loaded" as soon as they are announced, also in the middle of a group (an in-flight update): such a group spans
several versions. The process exits on Shutdown from the coordinator, or after --max-runtime seconds.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from collections import deque

import numpy as np

from async_rl.config import default_config
from async_rl.transport import RolloutClient, make_completion, unpack_array
from async_rl.transport.protocol import PromptGrant, RolloutGroup


def _generate(client: RolloutClient, grant: PromptGrant, gen_time_s: float, state: dict[str, int]) -> RolloutGroup:
    prompt = unpack_array(grant.prompt_token_ids)
    completions = []
    for i in range(grant.sampling.n):
        v_start = state["loaded"]
        end = time.monotonic() + gen_time_s / grant.sampling.n
        while time.monotonic() < end:
            client.poll(min(0.01, max(0.0, end - time.monotonic())))
            state["loaded"] = max(state["loaded"], client.policy_version)  # in-flight weight update
        tokens = np.concatenate([prompt[::-1], np.array([i], dtype=prompt.dtype)])
        completions.append(
            make_completion(
                tokens,
                np.full(len(tokens), -0.5, dtype=np.float32),
                version_min=v_start,
                version_max=state["loaded"],
                reward=float(grant.prompt_id),
                reward_components={"fake": 1.0},
            )
        )
    return RolloutGroup(
        prompt_id=grant.prompt_id,
        lease_id=grant.lease_id,
        actor_id=client.actor_id,
        completions=completions,
        timings={"generate_s": gen_time_s},
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--actor-id", required=True)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--gen-time", type=float, default=0.02, help="mean seconds per group")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heartbeat", type=float, default=0.1)
    p.add_argument("--peer-timeout", type=float, default=1.0)
    p.add_argument("--ack-timeout", type=float, default=0.5)
    p.add_argument("--max-runtime", type=float, default=60.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format=f"[{args.actor_id}] %(levelname)s %(name)s: %(message)s")
    rng = random.Random(args.seed)
    transport = default_config().async_training.transport
    transport.heartbeat_interval_s, transport.peer_timeout_s = args.heartbeat, args.peer_timeout
    client = RolloutClient(args.address, args.actor_id, transport, ack_timeout_s=args.ack_timeout)
    state = {"loaded": client.hello(loaded_version=0, timeout_s=20.0).policy_version}
    work: deque[PromptGrant] = deque()
    stop_at = time.monotonic() + args.max_runtime
    try:
        while not client.shutdown_requested and time.monotonic() < stop_at:
            state["loaded"] = max(state["loaded"], client.policy_version)
            if len(work) < args.slots:
                work.extend(client.request_work(args.slots - len(work), state["loaded"], timeout_s=0.02))
            else:
                client.poll(0.0)
            if work:
                grant = work.popleft()
                gen_time = args.gen_time * rng.uniform(0.5, 1.5)
                client.send_group(_generate(client, grant, gen_time, state))
        client.wait_acked(1.0)
    finally:
        client.close(linger_s=0.2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
