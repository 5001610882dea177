"""Train a Bradley-Terry reward model (a wrapper of ``async_rl.entrypoints.train_reward_model``; same arguments).

    python tools/train_reward_model.py --config configs/reward_model/tiny_toy.yaml
    torchrun --standalone --nproc-per-node 2 tools/train_reward_model.py --config configs/reward_model/smollm2_toy.yaml

See docs/reward_models.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.entrypoints._exit import exit_without_finalization  # noqa: E402
from async_rl.entrypoints.train_reward_model import main  # noqa: E402

if __name__ == "__main__":
    exit_without_finalization(main())
