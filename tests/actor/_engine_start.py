"""Starts one tiny-model GenerationEngine the way the actor does, in a process of its own: ``python _engine_start.py
MODEL_DIR OUT.json``. With ``ASYNC_RL_TEST_SINGLE_THREADED=1`` the process first declares itself single-threaded
(``async_rl.actor.vllm_launch.keep_torch_single_threaded``, as the actor's process does) and computes something with
torch on that thread. Writes the seeded tokens of a few groups, the engine core's thread count and cores, and this
process's own after the start."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main(model: str, out: str) -> None:
    import torch

    from async_rl.actor.engine import GenerationEngine
    from async_rl.actor.vllm_launch import keep_torch_single_threaded
    from async_rl.config import default_config
    from async_rl.config.resolve import engine_start
    from async_rl.transport.protocol import GroupSampling
    from async_rl.weight_sync import vllm_engine_kwargs

    if os.environ.get("ASYNC_RL_TEST_SINGLE_THREADED") == "1":
        keep_torch_single_threaded()
        a = torch.randn(512, 512)
        float((a @ a).sum())  # a parallel region in this process, on its one thread
    cfg = default_config()
    r = cfg.actor_rollout_ref.rollout
    r.dtype, r.max_model_len, r.max_num_seqs, r.enforce_eager = "float32", 64, 32, True
    cfg.trainer.seed = 0
    eng = GenerationEngine(
        cfg, engine_start(cfg, model_path=model, device_type="cpu"), extra_engine_kwargs=vllm_engine_kwargs()
    )
    loop = asyncio.new_event_loop()
    loop.run_until_complete(eng.start())
    sampling = GroupSampling.defaults(n=4, temperature=1.0, max_tokens=12, seed=7)

    async def generate() -> list[list[list[int]]]:
        groups = await asyncio.gather(*[eng.generate([5, 6, 7, 8 + i], sampling) for i in range(4)])
        return [[c.token_ids.tolist() for c in group] for group in groups]

    tokens = loop.run_until_complete(generate())
    layout = loop.run_until_complete(eng.cpu_layout())
    result = {
        "tokens": tokens,
        "core_threads": layout["threads"],
        "core_cores": layout["cores"],
        "threads": torch.get_num_threads(),
        "cores": sorted(os.sched_getaffinity(0)),
    }
    loop.run_until_complete(eng.shutdown())
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
