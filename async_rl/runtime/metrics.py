"""Per-step metrics sinks for the learner's rank 0: JSON lines, TensorBoard, Weights & Biases and a console display.

The learner produces one flat ``{key: float}`` dict per training step (keys namespaced with ``/``). ``MetricsLogger``
fans it out to the backends named in ``trainer.logger``:

``jsonl``        ``<run_dir>/metrics.jsonl``, one JSON object per step, flushed per line; the source of truth that
                 ``plot.py`` reads back. Non-finite floats become ``null`` so the file is always strict JSON.
``tensorboard``  ``torch.utils.tensorboard.SummaryWriter`` into ``<run_dir>/tensorboard``.
``wandb``        a wandb run (project / experiment name / config), one ``wandb.log`` per step.
``console``      a tqdm progress bar on a terminal; without a terminal (CI logs) only a compact line via ``logging``
                 about every 10% of the run, so logs stay short.

Optional backends whose package is missing (tensorboard, wandb) are skipped with one warning instead of failing the
run, and an error inside one of them later disables that backend only: metrics must never stop training. Errors of
the jsonl and console sinks propagate (a full disk should be noticed).

Every key is defined in the metric catalog (``async_rl/metric_catalog.py``: key, reduction, meaning); a key logged
that the catalog does not name is warned about once, and the keys read here are the catalog's constants.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TextIO

from async_rl import metric_catalog as mc
from async_rl.metric_catalog import find, record_kind

logger = logging.getLogger(__name__)

__all__ = [
    "ALLOWED_BACKENDS",
    "ActorActivity",
    "ConsoleSink",
    "JsonlSink",
    "MetricsLogger",
    "format_line",
    "format_val_line",
    "read_metrics",
]

ALLOWED_BACKENDS = ("console", "jsonl", "tensorboard", "wandb")
METRICS_FILE = "metrics.jsonl"
WALL_KEY = mc.TIME_WALL_S
# Present in (only) the records of validation rounds (runtime/validation.py), logged at the evaluated version's step.
VAL_VERSION_KEY = mc.VAL_VERSION

# (label, key, format) for the console line; missing keys are left out.
_CONSOLE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("reward", mc.LEARNER_BATCH_REWARD_MEAN, "{:.3f}"),
    ("gen tok/s", mc.ACTOR_GEN_TOKENS_PER_S, "{:.4g}"),
    ("learn tok/s", mc.LEARNER_PERF_TOKENS_PER_S, "{:.4g}"),
    ("stale", mc.LEARNER_STALENESS_MEAN, "{:.2f}"),
    ("ess", mc.LEARNER_OFFPOLICY_ESS, "{:.3f}"),
    ("sync", mc.SYNC_SECONDS, "{:.2f}s"),
    ("pg_loss", mc.LEARNER_ACTOR_PG_LOSS, "{:.4g}"),
)
_ACTOR_TOTALS = (
    mc.TRANSPORT_ACTORS_GENERATED_TOKENS_TOTAL,
    mc.TRANSPORT_ACTORS_IDLE_S_TOTAL,
    mc.TRANSPORT_ACTORS_UPTIME_S_TOTAL,
)
_ACTORS_ALIVE = mc.TRANSPORT_ACTORS_ALIVE
_VAL_REWARD, _VAL_SAMPLES, _VAL_WALL = mc.VAL_REWARD_MEAN, mc.VAL_NUM_SAMPLES, mc.VAL_WALL_S


class Sink(Protocol):
    """One metrics backend."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def _to_number(key: str, value: Any) -> float | int:
    """A JSON-friendly number for ``value`` (ints stay ints); ValueError naming ``key`` for anything else."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        return float(value)  # floats, numpy scalars, 0-d tensors
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metric {key!r} must be a number, got {type(value).__name__}: {value!r}") from exc


def _finite_or_none(value: float | int) -> float | int | None:
    return value if isinstance(value, int) or math.isfinite(value) else None


def _pick(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


class ActorActivity:
    """Per-step actor metrics from the coordinator's cumulative actor totals (``transport/actors/*_total``).

    Actors report cumulative counters about once a second, so between two learner steps the totals may not move; a
    window then stretches until they do. Over a window: ``actor/idle_fraction`` = idle actor-seconds / actor-seconds,
    and ``actor/gen_tokens_per_s`` = tokens / actor-seconds x live actors (the whole fleet's rate).
    """

    def __init__(self) -> None:
        self._prev = (0.0, 0.0, 0.0)

    def __call__(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        values = [_pick(metrics, key) for key in _ACTOR_TOTALS]
        if any(v is None for v in values):
            return {}
        tokens, idle, uptime = (float(v) for v in values)  # type: ignore[arg-type]
        d_tokens, d_idle, d_up = tokens - self._prev[0], idle - self._prev[1], uptime - self._prev[2]
        if d_up <= 0.0:
            return {}
        self._prev = (tokens, idle, uptime)
        alive = max(1.0, _pick(metrics, _ACTORS_ALIVE) or 1.0)
        return {
            mc.ACTOR_IDLE_FRACTION: min(1.0, max(0.0, d_idle / d_up)),
            mc.ACTOR_GEN_TOKENS_PER_S: max(0.0, d_tokens) / d_up * alive,
        }


def format_line(step: int, total_steps: int, metrics: Mapping[str, Any]) -> str:
    """The compact one-line summary of a step, e.g. ``step 10/100 (10%) | reward 0.512 | stale 0.80``."""
    parts = [f"step {step}/{total_steps} ({100.0 * step / total_steps:.0f}%)"]
    for label, key, fmt in _CONSOLE_FIELDS:
        value = _pick(metrics, key)
        if value is not None:
            parts.append(f"{label} {fmt.format(value)}")
    return " | ".join(parts)


def format_val_line(metrics: Mapping[str, Any]) -> str:
    """A validation round in one line, e.g. ``reward 0.875 | arith 0.875 | 8 samples | 3.2s``."""
    parts = [f"reward {_pick(metrics, _VAL_REWARD) or 0.0:.3f}"]
    for key, value in sorted(metrics.items()):
        source = mc.val_source_reward_mean_key.parse(key)
        if source is not None:
            parts.append(f"{source[0]} {value:.3f}")
    parts.append(f"{int(metrics.get(_VAL_SAMPLES, 0))} samples")
    parts.append(f"{float(metrics.get(_VAL_WALL, 0.0)):.1f}s")
    return " | ".join(parts)


class JsonlSink:
    """Appends one JSON object per step to a file; each line is flushed, so a crash loses at most the line in flight."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        assert self._file is not None, "JsonlSink used after close()"
        record: dict[str, float | int | None] = {"step": step}
        record.update({k: _finite_or_none(v) for k, v in metrics.items() if k != "step"})
        self._file.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file in file order (``null`` values come back as ``None``).

    A malformed LAST line is a write cut short by a crash: it is skipped with a warning. A malformed line anywhere
    else is a ValueError naming the file and line number.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records: list[dict[str, Any]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):
                logger.warning("%s: skipping truncated last line %d (%s)", path, lineno, exc)
                break
            raise ValueError(f"{path}: line {lineno} is not valid JSON: {exc}") from exc
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {lineno} is a JSON {type(record).__name__}, expected an object")
        records.append(record)
    return records


class TensorBoardSink:
    """Scalars into a TensorBoard event file (one tag per metric key)."""

    def __init__(self, log_dir: Path, writer_cls: Any) -> None:
        self._writer = writer_cls(log_dir=str(log_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            if key != "step":
                self._writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


class WandbSink:
    """A Weights & Biases run: ``wandb.init(project, name, config)`` then one ``wandb.log`` per step."""

    def __init__(self, wandb_module: Any, run_dir: Path, project: str, experiment: str, config: dict | None) -> None:
        self._run = wandb_module.init(project=project, name=experiment, config=config or {}, dir=str(run_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log({k: v for k, v in metrics.items() if k != "step"}, step=step)

    def close(self) -> None:
        self._run.finish()


class ConsoleSink:
    """Progress display. On a terminal: a tqdm bar (step/total plus reward, throughput, staleness, sync time) and a
    logged line every ``log_every`` steps. Otherwise no bar, only a logged line about every 10% of the run (and at the
    first and last step), so a 100-step run writes about a dozen lines to CI logs.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        stream: TextIO | None = None,
        is_tty: bool | None = None,
        log_every: int | None = None,
    ) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1 for the console display, got {total_steps}")
        if log_every is not None and log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {log_every}")
        self.total_steps = total_steps
        self.stream = stream if stream is not None else sys.stderr
        if is_tty is None:
            isatty = getattr(self.stream, "isatty", None)
            is_tty = bool(isatty()) if callable(isatty) else False
        self.is_tty = is_tty
        self.log_every = log_every if log_every is not None else max(1, math.ceil(total_steps / 10))
        self._last_logged: int | None = None
        self._started = time.monotonic()
        self._bar: Any = None
        if is_tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, file=self.stream, unit="step", dynamic_ncols=True, leave=True)

    def _due(self, step: int) -> bool:
        last = self._last_logged
        return last is None or step >= self.total_steps or step // self.log_every > last // self.log_every

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if VAL_VERSION_KEY in metrics:  # a validation round: always one line, the progress bar is left alone
            self._write(f"validation at step {step}: {format_val_line(metrics)}")
            return
        if self._bar is not None:
            postfix: dict[str, str] = {}
            for label, key, fmt in _CONSOLE_FIELDS[:-1]:  # all but the loss: keep the bar narrow
                value = _pick(metrics, key)
                if value is not None:
                    postfix[label] = fmt.format(value)
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(max(0, min(step, self.total_steps) - self._bar.n))
        if not self._due(step):
            return
        self._last_logged = step
        elapsed = time.monotonic() - self._started
        self._write(f"{format_line(step, self.total_steps, metrics)} | elapsed {elapsed:.0f}s")

    def _write(self, line: str) -> None:
        if self._bar is not None:
            from tqdm.contrib.logging import logging_redirect_tqdm

            with logging_redirect_tqdm():  # print above the bar instead of through it
                logger.info("%s", line)
        else:
            logger.info("%s", line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class MetricsLogger:
    """Fans each step's metrics out to the configured backends (see the module docstring); a context manager.

    ``time/wall_s`` (seconds since this logger was created) is added to a step's metrics when the caller did not
    provide it, so the wall-clock plot always has an axis.
    """

    def __init__(
        self,
        run_dir: Path,
        backends: list[str],
        *,
        project: str,
        experiment: str,
        total_steps: int,
        config: dict | None = None,
        console_stream: TextIO | None = None,
    ) -> None:
        if isinstance(backends, str):
            raise ValueError(f"backends must be a list of names, got the string {backends!r}")
        unknown = [b for b in backends if b not in ALLOWED_BACKENDS]
        if unknown:
            raise ValueError(
                f"trainer.logger: unknown backend(s) {', '.join(map(repr, unknown))}; "
                f"allowed: {', '.join(ALLOWED_BACKENDS)}"
            )
        self.run_dir = Path(run_dir)
        self.backends = list(dict.fromkeys(backends))  # de-duplicated, order kept
        self._started = time.monotonic()
        self._closed = False
        self._checked: set[tuple[str, str]] = set()  # (record, key) pairs looked up in the catalog
        self._sinks: dict[str, Sink] = {}
        for name in self.backends:
            sink = self._make_sink(name, project, experiment, total_steps, config, console_stream)
            if sink is not None:
                self._sinks[name] = sink

    @property
    def active_backends(self) -> list[str]:
        """The backends actually writing (missing optional packages and failed backends are left out)."""
        return list(self._sinks)

    def _make_sink(
        self,
        name: str,
        project: str,
        experiment: str,
        total_steps: int,
        config: dict | None,
        console_stream: TextIO | None,
    ) -> Sink | None:
        if name == "jsonl":
            return JsonlSink(self.run_dir / METRICS_FILE)
        if name == "console":
            return ConsoleSink(total_steps, stream=console_stream)
        if name == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                logger.warning("metrics: tensorboard backend disabled, cannot import it (%s)", exc)
                return None
            return TensorBoardSink(self.run_dir / "tensorboard", SummaryWriter)
        assert name == "wandb", name
        try:
            import wandb
        except ImportError:
            logger.warning("metrics: wandb backend disabled, the 'wandb' package is not installed (pip install wandb)")
            return None
        try:
            return WandbSink(wandb, self.run_dir, project, experiment, config)
        except Exception:
            logger.exception("metrics: wandb backend disabled, wandb.init failed")
            return None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record one training step's metrics in every active backend."""
        if self._closed:
            raise RuntimeError("MetricsLogger.log() called after close()")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        clean: dict[str, float] = {str(k): _to_number(str(k), v) for k, v in metrics.items()}
        clean.setdefault(WALL_KEY, time.monotonic() - self._started)
        self._warn_uncatalogued(clean)
        for name, sink in list(self._sinks.items()):
            if name in ("jsonl", "console"):
                sink.log(step, clean)
                continue
            try:
                sink.log(step, clean)
            except Exception:
                logger.exception("metrics: %s backend failed at step %d; disabling it", name, step)
                del self._sinks[name]

    def _warn_uncatalogued(self, metrics: Mapping[str, float]) -> None:
        """Warn once per key that the metric catalog does not name (a new metric needs its entry there)."""
        record = record_kind(metrics)
        for key in metrics:
            if (record, key) not in self._checked:
                self._checked.add((record, key))
                if find(key, record) is None:
                    logger.warning("metric %r is not in async_rl/metric_catalog.py; add it there", key)

    def close(self) -> None:
        """Flush and close every backend; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for name, sink in self._sinks.items():
            try:
                sink.close()
            except Exception:
                logger.exception("metrics: closing the %s backend failed", name)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
