"""Two kinds of vLLM warning that an actor's engine logs by design, kept to what a reader needs.

* "Attempted to load weight %s with dtype %s into parameter with dtype %s": vLLM warns once per tensor when it casts a
  checkpoint to the dtype it serves. The actor asks for that cast (``rollout.dtype: auto`` serves bf16 where the CPU
  computes it faster, from the fp32 checkpoint the learner trains), so SmolLM2 printed 130 such lines at every start.
  The first of each pair of dtypes is kept, saying that the rest are left out.
* "%s: Failed to load weights": after every update, vLLM's layer-wise reload names each layer that holds values but
  loaded none. Two kinds are expected: a rotary embedding (its table is computed, never in a checkpoint) and a layer
  that shares its parameter with another (a tied output layer; :mod:`async_rl.actor.tied_weights` processes it again
  and checks it after every update). Those are left out; any other layer still warns.

:func:`install` attaches the filter to those two vLLM loggers (in the process that runs the model: the worker
extension's module calls it when vLLM imports it).
"""

from __future__ import annotations

import logging

__all__ = ["DOWNCAST", "NOTHING_LOADED", "VllmWarnings", "install"]

DOWNCAST = "Attempted to load weight %s with dtype %s into parameter with dtype %s"
NOTHING_LOADED = "%s: Failed to load weights"
LOGGERS = ("vllm.model_executor.models.utils", "vllm.model_executor.model_loader.reload.layerwise")


class VllmWarnings(logging.Filter):
    """Drops the expected repeats above; ``tied_classes`` names the layer classes that share a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.tied_classes: set[str] = set()
        self.casts_seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == DOWNCAST and len(args) == 3:
            cast = (str(args[1]), str(args[2]))
            if cast in self.casts_seen:
                return False
            self.casts_seen.add(cast)
            record.msg = DOWNCAST + " (the actor serves that dtype; further weights cast the same way are not logged)"
            return True
        if record.msg == NOTHING_LOADED and len(args) == 1:
            name = str(args[0])
            return not (name.endswith("RotaryEmbedding") or name in self.tied_classes)
        return True


_filter: VllmWarnings | None = None


def install() -> VllmWarnings:
    """Attach the process's one :class:`VllmWarnings` to vLLM's loggers (idempotent) and return it."""
    global _filter
    if _filter is None:
        _filter = VllmWarnings()
        for name in LOGGERS:
            logging.getLogger(name).addFilter(_filter)
    return _filter
