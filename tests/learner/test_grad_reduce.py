"""InPlaceReduceScatter (learner/grad_reduce.py) on 2 gloo ranks: the same bits as gloo's reduce-scatter, alone and
as FSDP2's gradient collective; and, in the same run, a tied embedding's gradient rows (learner/tied_embedding.py)
under FSDP2 against the dense embedding gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_learner_distributed import run_worker

from async_rl.learner.grad_reduce import InPlaceReduceScatter


def test_in_place_reduce_scatter_gives_gloos_bits_and_fsdp2s_gradients(tmp_path: Path) -> None:
    res = run_worker("grad_reduce", tmp_path)
    for rank in (0, 1):
        # 4 sizes x (sum, average): bit-identical to dist.reduce_scatter_tensor on gloo
        assert res[f"collective_equal_rank{rank}"] == [True] * 8
        assert res[f"out_separate_rank{rank}"] is True  # the output never aliases the lent input block
        assert res[f"block_kept_rank{rank}"] is True  # one block, sized by the largest input
        assert res[f"fsdp_grads_equal_rank{rank}"] is True
    assert "does not split over 2 ranks" in res["odd_input_error"]
    # build_model put it on all 3 units of the tiny policy (2 decoder layers + root); the reference run did not
    assert res["in_place_units"] == 3 and res["in_place_comms"] == ["InPlaceReduceScatter"]
    assert res["gloo_comms"] == ["InPlaceReduceScatter"]  # then swapped for FSDP2's default, for the comparison
    assert res["fsdp_grad_count"] > 5
    for rank in (0, 1):
        assert res[f"tied_rows_switched_rank{rank}"] is True and res[f"tied_dense_switched_rank{rank}"] is True
        assert res[f"tied_grads_equal_rank{rank}"] is True
    assert res["tied_embedding_grad_norm"] > 1e-3


def test_in_place_reduce_scatter_rejects_a_single_rank_and_an_unexpected_output_size() -> None:
    with pytest.raises(ValueError, match="world_size must be >= 2"):
        InPlaceReduceScatter(1)
    comm = InPlaceReduceScatter(2)
    block = comm.allocate((8,), dtype=torch.float32, device=torch.device("cpu"))
    assert block.numel() == 8
    with pytest.raises(RuntimeError, match="expected 4"):
        comm.allocate((3,), dtype=block.dtype, device=block.device)
    # an output that is a view of the lent block is refused before any communication
    with pytest.raises(RuntimeError, match="lent from the input block"):
        comm(block[:4], block, _OneGroup(), None)


class _OneGroup:
    """What __call__ reads of a process group before communicating: 2 ranks."""

    def size(self) -> int:
        return 2

    def rank(self) -> int:
        return 0
