"""Helpers for declaring documented, constrained config fields.

Every field of the config tree is written ``Annotated[T, doc("...")]`` so its description lives next to its type and
``--help`` can print it. Keys that change nothing in this system (mostly verl's, accepted so a verl command line
ports unchanged) are declared with :func:`noop` instead, whose description says what happens instead: validation warns
when one is set to a non-default value, and ``tests/config/test_no_lying_keys.py`` checks that every other key is read
by the code. The constrained aliases (``PosInt``, ``Prob``, ...) let msgspec itself reject out-of-range numbers with
the key.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

# Key stored in ``msgspec.Meta.extra`` marking a field (or section) that is accepted but has no effect here.
NOOP_MARK = "verl_noop"
NOOP_PREFIX = "[no effect here]"

PosInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
PosFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
Prob = Annotated[float, msgspec.Meta(ge=0, le=1)]
UnitInterval = Annotated[float, msgspec.Meta(gt=0, le=1)]
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


def doc(description: str, **constraints: Any) -> msgspec.Meta:
    """Field metadata: the ``--help`` description plus optional msgspec constraints (``ge=``, ``le=``, ...)."""
    return msgspec.Meta(description=description, **constraints)


def noop(description: str, **constraints: Any) -> msgspec.Meta:
    """Metadata for a key accepted (mostly for verl compatibility) but without effect; setting it produces a start-up
    warning. ``description`` says what happens instead."""
    return msgspec.Meta(description=f"{NOOP_PREFIX} {description}", extra={NOOP_MARK: True}, **constraints)


__all__ = [
    "NOOP_MARK",
    "NOOP_PREFIX",
    "NonEmptyStr",
    "NonNegFloat",
    "NonNegInt",
    "PosFloat",
    "PosInt",
    "Port",
    "Prob",
    "UnitInterval",
    "doc",
    "noop",
]
