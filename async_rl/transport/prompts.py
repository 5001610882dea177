"""The coordinator's prompt source: a fixed sequence of records walked by a deterministic data cursor.

A prompt id is ``epoch * len(records) + position``, so ids are unique per (epoch, position), increase in grant order,
and the cursor is recoverable from the next id alone. With ``shuffle_seed`` each epoch visits the records in a
permutation drawn from ``(shuffle_seed, epoch)``; resuming therefore needs only the next id and the seed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PromptRecord:
    """Prompt token ids plus arbitrary msgpack-able extras (ground truth, task tags, ...) forwarded to the actor."""

    token_ids: np.ndarray
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, record: Mapping[str, Any], token_key: str = "prompt_token_ids") -> PromptRecord:
        """``{token_key: [ids...], **extras}`` -> PromptRecord; raises ValueError naming a missing/bad key."""
        if token_key not in record:
            raise ValueError(f"prompt record has no key {token_key!r}; keys: {sorted(record)}")
        tokens = np.asarray(record[token_key])
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer) or (tokens < 0).any():
            raise ValueError(f"record[{token_key!r}] must be a 1-D sequence of non-negative ints")
        return cls(tokens.astype("<i4"), {k: v for k, v in record.items() if k != token_key})


class PromptSource:
    """Maps prompt ids to records. ``max_epochs=None`` cycles forever."""

    def __init__(
        self, records: Sequence[PromptRecord], *, shuffle_seed: int | None = None, max_epochs: int | None = None
    ):
        if len(records) == 0:
            raise ValueError("records must not be empty")
        if max_epochs is not None and (
            isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1
        ):
            raise ValueError(f"max_epochs must be an int >= 1 or None, got {max_epochs!r}")
        for i, rec in enumerate(records):
            if not isinstance(rec, PromptRecord):
                raise ValueError(f"records[{i}] must be a PromptRecord, got {type(rec).__name__}")
            if rec.token_ids.ndim != 1 or not np.issubdtype(rec.token_ids.dtype, np.integer):
                raise ValueError(f"records[{i}].token_ids must be a 1-D integer array")
        self.records = records
        self.shuffle_seed = shuffle_seed
        self.max_epochs = max_epochs

    def __len__(self) -> int:
        return len(self.records)

    @property
    def total(self) -> int | None:
        """Total prompt ids ever produced, or None when unbounded."""
        return None if self.max_epochs is None else self.max_epochs * len(self.records)

    def cursor(self, prompt_id: int) -> tuple[int, int]:
        """(epoch, position) of a prompt id."""
        return divmod(prompt_id, len(self.records))

    def record(self, prompt_id: int) -> PromptRecord:
        epoch, pos = self.cursor(prompt_id)
        if self.shuffle_seed is None:
            return self.records[pos]
        return self.records[int(self._permutation(epoch)[pos])]

    @functools.lru_cache(maxsize=4)  # noqa: B019 - a handful of live epochs; the source lives as long as the run
    def _permutation(self, epoch: int) -> np.ndarray:
        assert self.shuffle_seed is not None
        rng = np.random.default_rng([self.shuffle_seed, epoch])
        return rng.permutation(len(self.records))
