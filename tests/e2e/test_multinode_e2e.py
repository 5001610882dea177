"""Multi-node on one machine: two learner "nodes" as separate torchrun invocations (c10d rendezvous on loopback,
one rank each) plus a separate actor process, as launchers/learner_node.sh and actor_node.sh run them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from _e2e_helpers import ROOT, free_port

from async_rl.runtime.allocator import find_tcmalloc, search_dirs

STEPS = 4


@pytest.mark.slow
def test_two_learner_nodes_and_a_separate_actor(tmp_path):
    run_dir = tmp_path / "run"
    rdzv, port, ws_port = free_port(), free_port(), free_port()
    overrides = [
        "--config",
        str(ROOT / "configs" / "smoke_grpo.yaml"),
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={STEPS}",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        f"async_training.transport.port={port}",
        f"async_training.weight_sync.master_port={ws_port}",
        "trainer.logger=['jsonl']",
    ]
    procs = []
    try:
        for node_rank in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node_rank),
                   "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{rdzv}",
                   "--rdzv_id", "mn-test", "-m", "async_rl.entrypoints.train", *overrides]  # fmt: skip
            log = (tmp_path / f"node{node_rank}.log").open("wb")
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        actor = [sys.executable, "-m", "async_rl.entrypoints.actor", *overrides, "--coordinator",
                 f"tcp://127.0.0.1:{port}", "--actor-id", "actor-0"]  # fmt: skip
        log = (tmp_path / "actor.log").open("wb")
        procs.append(subprocess.Popen(actor, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        codes = [p.wait(timeout=600) for p in procs]
        logs = {f.name: f.read_text()[-2000:] for f in tmp_path.glob("*.log")}
        assert codes == [0, 0, 0], logs
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(m["sync/actors"] == 1.0 and m["sync/failures"] == 0.0 for m in metrics)
    learner_logs = (tmp_path / "node0.log").read_text() + (tmp_path / "node1.log").read_text()
    assert "world_size=2" in learner_logs  # one FSDP2 group spanning both "nodes"
    # the entry points re-ran themselves with tcmalloc preloaded where this host has it, and said which allocator
    expected = "allocator: tcmalloc (LD_PRELOAD=" if find_tcmalloc(search_dirs(os.environ)) else "no tcmalloc found"
    assert expected in (tmp_path / "node0.log").read_text()
    assert expected in (tmp_path / "actor.log").read_text()
