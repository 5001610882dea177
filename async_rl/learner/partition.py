"""Who computes what: balanced rank partitions, mini/micro-batch splitting and their waste statistics (pure).

Every rank holds the whole step batch (groups are broadcast), so splitting is a deterministic function of the
sequence lengths, the world size and a seed: each rank computes the same plan and takes its own share, and no
collective is needed to agree on it.

Semantics follow verl: one *mini-batch* is ``ppo_mini_batch_size x n`` sequences and gets one optimizer step;
``ppo_epochs`` passes go over the batch (re-shuffled each epoch when ``shuffle``); a rank's share of a mini-batch is
cut into *micro-batches* of ``ppo_micro_batch_size_per_gpu`` sequences for gradient accumulation. Each mini-batch is
split across ranks with the equal-size Karmarkar-Karp differencing method on token counts, so every rank does the
same number of micro-steps (FSDP collectives must line up) and about the same number of tokens. Within a rank,
sequences are sorted by length before being cut into micro-batches, which is length-bucketing: it minimises padding
when sequences are padded per micro-batch.

With shared prompts (``groups`` given: each row's group), a group's rows stay together, because a micro-batch computes
each group's prompt once (``shared_prompt.py``): when every group of a mini-batch has the same number of rows and
the groups divide evenly over the ranks, whole groups are balanced over ranks (Karmarkar-Karp on group token
counts); otherwise rows are, as without groups. Within a rank the rows are ordered group by group (longest group
first) before being cut into micro-batches, so only a group that straddles a cut has its prompt computed twice.
Shuffling then permutes groups, not rows.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch

__all__ = [
    "LAYOUTS",
    "Layout",
    "UpdatePlan",
    "computed_rows",
    "karmarkar_karp",
    "pack_rows",
    "padding_waste",
    "plan_forward",
    "plan_updates",
    "rank_shares",
    "split_micro",
    "token_imbalance",
]


Layout = Literal["padded", "packed", "shared"]
"""How a micro-batch's rows become model input: padded rows, packed rows of whole sequences, or one row with each
group's prompt once (``policy.py``, ``shared_prompt.py``)."""
LAYOUTS: tuple[Layout, ...] = get_args(Layout)


def karmarkar_karp(weights: Sequence[int], k: int) -> list[list[int]]:
    """Split item indices ``0..len(weights)-1`` into ``k`` sets of equal size with near-equal weight sums.

    Largest-differencing (Karmarkar-Karp) with an equal-cardinality constraint: items sorted by weight are cut into
    runs of ``k``; each run is a partial partition with one item per set; the two partial partitions with the largest
    spread (max - min set sum) are merged repeatedly, pairing the heaviest set of one with the lightest of the other.
    Merging never widens the spread beyond the wider input, so the final spread is at most ``max(w) - min(w)``.
    Requires ``len(weights) % k == 0``. Deterministic; each returned set is sorted.
    """
    n = len(weights)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n % k:
        raise ValueError(f"len(weights)={n} is not divisible by k={k} (equal-size partition)")
    if n == 0:
        return [[] for _ in range(k)]
    order = sorted(range(n), key=lambda i: (weights[i], i))
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for c, start in enumerate(range(0, n, k)):
        sets = [(int(weights[i]), [i]) for i in order[start : start + k]]
        heapq.heappush(heap, (-(sets[-1][0] - sets[0][0]), c, sets))
    counter = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        a_desc = sorted(a, key=lambda s: -s[0])
        b_asc = sorted(b, key=lambda s: s[0])
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a_desc, b_asc, strict=True)]
        sums = [s for s, _ in merged]
        heapq.heappush(heap, (-(max(sums) - min(sums)), counter, merged))
        counter += 1
    final = sorted(heap[0][2], key=lambda s: (-s[0], min(s[1])))
    return [sorted(items) for _, items in final]


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit-decreasing bin packing of item indices into rows holding at most ``capacity`` tokens.

    Used for sequence packing: each row is one model input row of concatenated sequences. Raises ``ValueError`` when
    an item is longer than ``capacity``. Deterministic; rows are returned in creation order.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i)):
        need = int(lengths[i])
        if need > capacity:
            raise ValueError(f"item {i} has length {need} > capacity={capacity}")
        for r, room in enumerate(free):
            if need <= room:
                rows[r].append(i)
                free[r] -= need
                break
        else:
            rows.append([i])
            free.append(capacity - need)
    return rows


def token_imbalance(weights: Sequence[int], parts: Sequence[Sequence[int]]) -> float:
    """``max(part sum) / mean(part sum) - 1``: 0 is perfect balance (the slowest rank sets the pace)."""
    sums = [sum(int(weights[i]) for i in p) for p in parts]
    mean = sum(sums) / len(sums) if sums else 0.0
    return 0.0 if mean == 0 else max(sums) / mean - 1.0


def split_micro(
    indices: Sequence[int],
    lengths: Sequence[int],
    micro_size: int,
    sort: bool = True,
    groups: Sequence[int] | None = None,
) -> list[list[int]]:
    """Cut ``indices`` into chunks of ``micro_size`` (the last may be smaller), longest first when ``sort``; with
    ``groups``, the rows of a group are adjacent (groups by total tokens, longest first; rows longest first)."""
    if micro_size < 1:
        raise ValueError(f"micro_size must be >= 1, got {micro_size}")
    if groups is not None:
        members = _by_group(indices, groups)
        totals = {g: sum(int(lengths[i]) for i in rows) for g, rows in members.items()}
        order = sorted(members, key=lambda g: (-totals[g], min(members[g])))
        idx = [i for g in order for i in sorted(members[g], key=lambda i: (-int(lengths[i]), i))]
    else:
        idx = sorted(indices, key=lambda i: (-int(lengths[i]), i)) if sort else list(indices)
    return [idx[s : s + micro_size] for s in range(0, len(idx), micro_size)]


def _by_group(indices: Sequence[int], groups: Sequence[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {}
    for i in indices:
        members.setdefault(int(groups[i]), []).append(i)
    return members


def rank_shares(
    indices: Sequence[int], lengths: Sequence[int], world_size: int, groups: Sequence[int] | None = None
) -> list[list[int]]:
    """``indices`` split into ``world_size`` equal-size shares of near-equal token counts: whole groups when
    ``groups`` is given and the groups allow it (equal sizes, a count divisible by ``world_size``), rows otherwise."""
    rows = list(indices)
    if groups is not None:
        members = _by_group(rows, groups)
        sizes = {len(m) for m in members.values()}
        if len(sizes) == 1 and len(members) % world_size == 0:
            keys = list(members)
            parts = karmarkar_karp([sum(int(lengths[i]) for i in members[g]) for g in keys], world_size)
            return [sorted(i for j in part for i in members[keys[j]]) for part in parts]
    local = karmarkar_karp([lengths[i] for i in rows], world_size)
    return [[rows[j] for j in part] for part in local]


def plan_forward(
    lengths: Sequence[int], world_size: int, rank: int, micro_size: int, *, groups: Sequence[int] | None = None
) -> list[list[int]]:
    """This rank's micro-batches for a no-grad pass over the whole batch (equal counts on every rank); ``groups``
    keeps each group's rows together (shared prompts)."""
    _check_rank(world_size, rank)
    parts = rank_shares(range(len(lengths)), lengths, world_size, groups)
    return split_micro(parts[rank], lengths, micro_size, groups=groups)


def forward_order(lengths: Sequence[int], world_size: int) -> list[int]:
    """Global row order of the concatenated per-rank shares of :func:`plan_forward` (rank 0 first)."""
    return [i for part in karmarkar_karp(lengths, world_size) for i in part]


@dataclass(frozen=True)
class UpdatePlan:
    """This rank's micro-batches: ``epochs[e][m]`` is the list of micro-batches of mini-batch ``m`` in epoch ``e``;
    ``counted[e][m]`` is this rank's share of that whole mini-batch, rows left out of the computation included (the
    loss is normalised over it, so leaving rows out does not change it); ``left_out`` counts the rows left out of the
    first epoch's mini-batches."""

    epochs: list[list[list[list[int]]]]
    counted: list[list[list[int]]]
    left_out: int
    imbalance: float  # mean over mini-batches of the per-rank token imbalance

    @property
    def num_updates(self) -> int:
        return sum(len(e) for e in self.epochs)


def computed_rows(rows: Sequence[int], skip: Sequence[bool], world_size: int) -> list[int]:
    """``rows`` (in order) without those ``skip`` marks, except that the first marked rows stay until every rank has
    at least one row and the count divides by ``world_size``: every rank must run the same number of micro-steps."""
    kept = sum(1 for i in rows if not skip[i])
    target = max(world_size, -(-kept // world_size) * world_size)  # the next multiple of world_size, at least one
    back = set([i for i in rows if skip[i]][: max(min(target, len(rows)) - kept, 0)])
    return [i for i in rows if not skip[i] or i in back]


def plan_updates(
    lengths: Sequence[int],
    *,
    mini_size: int,
    micro_size: int,
    epochs: int,
    world_size: int,
    rank: int,
    shuffle: bool,
    seed: int,
    groups: Sequence[int] | None,
    skip: Sequence[bool] | None,
) -> UpdatePlan:
    """Split the batch into mini-batches (one optimizer step each), balance each across ranks, cut into micro-batches.

    ``mini_size`` counts sequences (verl's ``ppo_mini_batch_size * rollout.n``). Raises ``ValueError`` unless the
    batch divides into whole mini-batches and each mini-batch into equal per-rank shares. ``groups`` (each row's
    group) keeps groups together: see the module docstring. ``skip`` marks rows whose loss and gradient are zero: a
    mini-batch's other rows are balanced and computed (:func:`computed_rows`), while ``counted`` keeps its shares as
    if none were left out.
    """
    _check_rank(world_size, rank)
    n = len(lengths)
    if mini_size < 1 or n % mini_size:
        raise ValueError(f"batch of {n} sequences does not divide into mini-batches of mini_size={mini_size}")
    if mini_size % world_size:
        raise ValueError(f"mini_size={mini_size} sequences is not divisible by world_size={world_size}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if skip is not None and len(skip) != n:
        raise ValueError(f"skip marks {len(skip)} rows, the batch has {n}")
    plan: list[list[list[list[int]]]] = []
    counted: list[list[list[int]]] = []
    imbalances: list[float] = []
    left_out = 0
    for epoch in range(epochs):
        order = _epoch_order(n, shuffle, seed * 1_000_003 + epoch, groups)
        minis: list[list[list[int]]] = []
        shares: list[list[int]] = []
        for start in range(0, n, mini_size):
            rows = order[start : start + mini_size]
            parts = rank_shares(rows, lengths, world_size, groups)
            shares.append(parts[rank])
            if skip is not None and any(skip[i] for i in rows):
                kept = computed_rows(rows, skip, world_size)
                if epoch == 0:
                    left_out += len(rows) - len(kept)
                parts = rank_shares(kept, lengths, world_size, groups)
            imbalances.append(token_imbalance(lengths, parts))
            minis.append(split_micro(parts[rank], lengths, micro_size, groups=groups))
        plan.append(minis)
        counted.append(shares)
    return UpdatePlan(epochs=plan, counted=counted, left_out=left_out, imbalance=sum(imbalances) / len(imbalances))


def _epoch_order(n: int, shuffle: bool, seed: int, groups: Sequence[int] | None) -> list[int]:
    """Row order of one epoch: as collated, or shuffled (by group when ``groups`` is given)."""
    if not shuffle:
        return list(range(n))
    gen = torch.Generator().manual_seed(seed)
    if groups is None:
        return torch.randperm(n, generator=gen).tolist()
    members = _by_group(range(n), groups)
    keys = list(members)
    return [i for j in torch.randperm(len(keys), generator=gen).tolist() for i in members[keys[j]]]


def padding_waste(
    prompt_lengths: Sequence[int],
    response_lengths: Sequence[int],
    micro_batches: Sequence[Sequence[int]],
    layout: Layout,
    groups: Sequence[int] | None = None,
) -> tuple[int, int]:
    """``(real_tokens, computed_slots)`` over ``micro_batches``; waste is ``1 - real/slots``.

    ``padded`` micro-batches are trimmed to their own longest prompt and response, so each costs
    ``rows x (max prompt + max response)`` slots; ``packed`` ones cost ``packed rows x longest packed row`` (see
    :func:`pack_rows`, with the longest sequence as the row capacity); ``shared`` ones (``groups`` required) have no
    padding and count each group's prompt once per micro-batch, so both numbers are the tokens computed.
    """
    real = slots = 0
    for mb in micro_batches:
        if not mb:
            continue
        if layout == "shared":
            if groups is None:
                raise ValueError("the shared layout needs each row's group")
            prompts = {int(groups[i]): int(prompt_lengths[i]) for i in mb}
            computed = sum(prompts.values()) + sum(int(response_lengths[i]) for i in mb)
            real += computed
            slots += computed
            continue
        lengths = [int(prompt_lengths[i]) + int(response_lengths[i]) for i in mb]
        real += sum(lengths)
        if layout == "packed":
            rows = pack_rows(lengths, max(lengths))
            slots += len(rows) * max(sum(lengths[j] for j in row) for row in rows)
        else:
            slots += len(mb) * (max(int(prompt_lengths[i]) for i in mb) + max(int(response_lengths[i]) for i in mb))
    return real, slots


def _check_rank(world_size: int, rank: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
