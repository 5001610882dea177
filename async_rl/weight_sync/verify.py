"""Check that a weight update actually reached the model's parameters: no tensor missing, none a silent no-op.

The transfer digest proves the actor *received* what the learner sent. It says nothing about what the model *holds*:
a checkpoint name the model does not recognise is skipped by ``load_weights`` without error, a tensor the learner
left out simply keeps its old value, and vLLM fuses and repacks weights at load. This verifier closes that gap.

It maps checkpoint names onto the model's parameters using the model's ``packed_modules_mapping`` (``q_proj``,
``k_proj``, ``v_proj`` -> rows of ``qkv_proj``; ``gate_proj``, ``up_proj`` -> rows of ``gate_up_proj``), records
an expectation for every received tensor (:meth:`LoadVerifier.observe`), and after loading checks every parameter
(:meth:`LoadVerifier.verify`):

* a received name that maps to no parameter is an error (it would have been silently dropped);
* a parameter none of whose parts arrived is an error when the update must be complete, one with only some of its
  parts arrived (a partial fused load) always is;
* where the model still holds the weight in checkpoint layout (GPU, embeddings, norms, biases), each row range is
  digested again from the parameter itself and must match the received bytes exactly (after the same dtype cast the
  loader applies);
* where it does not (vLLM on CPU drops linear weights after packing them for oneDNN: the parameter becomes an empty
  tensor), the layer is probed through its own kernel: one-hot input rows read back selected columns of every output
  row exactly, and a dense random input row checks whole rows (a fixed random sample of each part's output rows) within
  a float tolerance. The sample keeps the expectations cheap to record as the tensors arrive (the dense product over
  every row read each weight once more, ~0.1 s of a 0.5 GB update on 2 cores); a load that misses part of a row range
  or of a column range still shows in the columns or the sampled rows.

Rotation (``begin(rotation=N)``): every update gets the structural checks above (every received tensor placed, every
fused part present, row counts); the *values* of 1/N of the parameters are checked per update, in turn, so each is
value-checked at least every N updates. The first update, and the one after any update that did not verify, check
every value. A loader that persistently drops a tensor (a name or fusion mismatch) is therefore caught within N
updates, at 1/N of the cost of checking all values every time (on CPU, reading every weight back through its kernel
cost ~0.2 s of a 0.5 GB update, about as much as the transfer itself).

Scope: unsharded parameters (tensor parallel size 1) of models whose vLLM parameter names follow the checkpoint
names up to the packed-module fusion (Qwen2, Llama and similar). Weight changes smaller than the dense-probe tolerance
(relative 1e-4 in fp32) in probe-only layers are below what this check can see.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from async_rl.weight_sync.digest import TensorDigest, algo_for_device, digest_tensor
from async_rl.weight_sync.errors import WeightMismatchError

logger = logging.getLogger(__name__)

__all__ = ["LoadVerifier", "VerifyReport"]

_ONEHOT_RTOL = 1e-6
_DENSE_RTOL = {torch.float64: 1e-9, torch.float32: 1e-4}
_DENSE_RTOL_DEFAULT = 2e-2  # half-precision kernels


@dataclass
class _Target:
    module: str
    leaf: str
    parts: list[str]
    sizes: list[int]
    dtype: torch.dtype
    probe: bool
    readable: bool  # the parameter held its weight in checkpoint layout when the verifier was built


@dataclass
class _Expect:
    shape: tuple[int, ...]
    digest: TensorDigest | None
    onehot: torch.Tensor | None = None
    dense: torch.Tensor | None = None


@dataclass
class VerifyReport:
    """Parts checked bit for bit, parts checked by probing, and parameters that could not be checked."""

    bitwise: int = 0
    probed: int = 0
    unverified: list[str] = field(default_factory=list)
    deferred: int = 0  # parts whose values are left to a later update of the rotation (their structure is checked)
    observe_seconds: float = 0.0  # recording the expectations, as the tensors arrived
    verify_seconds: float = 0.0  # checking the loaded model against them


def _is_probeable(module: nn.Module) -> bool:
    method = getattr(module, "quant_method", None)
    return callable(getattr(method, "apply", None)) and hasattr(module, "input_size")


class LoadVerifier:
    """Expectations for one update of ``model``; build it while the model is live (before a layer-wise reload)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        device: torch.device | str,
        seed: int,
        packed_modules_mapping: Mapping[str, list[str]] | None = None,
        ignore_names: Iterable[str] = (),
        probe_columns: int = 4,
        probe_rows: int = 16,
    ) -> None:
        if probe_columns < 1 or probe_rows < 1:
            raise ValueError(f"probe_columns and probe_rows must be >= 1, got {probe_columns}, {probe_rows}")
        mapping = dict(packed_modules_mapping or getattr(model, "packed_modules_mapping", None) or {})
        self.device = torch.device(device)
        self.algo = algo_for_device(self.device)
        self.ignore = frozenset(ignore_names)
        self.probe_columns = probe_columns
        self.probe_rows = probe_rows
        self.seed = seed
        self._targets: dict[str, _Target] = {}
        self._where: dict[str, tuple[str, int]] = {}
        seen: set[int] = set()
        for mod_name, mod in model.named_modules():
            parent, _, last = mod_name.rpartition(".")
            subs = mapping.get(last)
            for leaf, param in mod.named_parameters(recurse=False):
                if id(param) in seen:  # a tied parameter (lm_head = embed_tokens): checked once, under its first name
                    continue
                seen.add(id(param))
                key = f"{mod_name}.{leaf}" if mod_name else leaf
                if subs:
                    parts = [f"{parent}.{s}.{leaf}" if parent else f"{s}.{leaf}" for s in subs]
                else:
                    parts = [key]
                sizes = [int(s) for s in getattr(mod, "output_sizes", None) or []] if subs else []
                probe = leaf == "weight" and _is_probeable(mod)
                sizes = sizes if len(sizes) == len(parts) else []
                readable = not param.is_meta and param.numel() > 0
                self._targets[key] = _Target(mod_name, leaf, parts, sizes, param.dtype, probe, readable)
                for i, part in enumerate(parts):
                    self._where[part] = (key, i)
        self._keys = sorted(self._targets)  # the order of the checks and of the rotation's slots
        self._inputs: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self._rows: dict[int, torch.Tensor] = {}
        self._full_next = True  # the first update checks every value
        self._round = 0
        self.begin()

    @property
    def checkpoint_names(self) -> list[str]:
        """Every checkpoint name the model can place, sorted."""
        return sorted(self._where)

    def begin(self, rotation: int = 1) -> None:
        """Forget the expectations of the previous update; this one checks the values of 1/``rotation`` of the
        parameters (all of them if ``rotation`` is 1, on the first update, and after one that did not verify)."""
        if rotation < 1:
            raise ValueError(f"rotation must be >= 1, got {rotation}")
        self._expect: dict[str, dict[int, _Expect]] = {}
        self._unplaced: list[str] = []
        self._observe_seconds = 0.0
        if self._full_next or rotation == 1:
            self._due = frozenset(self._keys)
        else:
            slot = self._round % rotation
            self._round += 1
            self._due = frozenset(k for i, k in enumerate(self._keys) if i % rotation == slot)
        self._full_next = True  # until this update verifies

    def observe(self, name: str, tensor: torch.Tensor) -> None:
        """Record what parameter ``name`` must hold once ``tensor`` has been loaded."""
        t0 = time.perf_counter()
        try:
            self._observe(name, tensor)
        finally:
            self._observe_seconds += time.perf_counter() - t0

    def _observe(self, name: str, tensor: torch.Tensor) -> None:
        loc = self._where.get(name)
        if loc is None:
            if name not in self.ignore:
                self._unplaced.append(name)
            return
        key, index = loc
        target = self._targets[key]
        if key not in self._due:  # its values wait for their turn in the rotation: no cast, no copy
            self._expect.setdefault(key, {})[index] = _Expect(tuple(tensor.shape), None)
            return
        value = tensor.detach()
        value = value if value.dtype == target.dtype else value.to(target.dtype)
        value = value.to(self.device)
        # Digest only what can be read back: a weight vLLM repacked away will be probed instead.
        wanted = target.readable or not target.probe
        exp = _Expect(tuple(value.shape), digest_tensor(name, value, str(target.dtype), self.algo) if wanted else None)
        if target.probe and value.dim() == 2:
            cols, dense = self._probe_inputs(value.shape[1], target.dtype)
            exp.onehot = value.index_select(1, cols).T.float()
            exp.dense = dense.float() @ value[self._probe_row_sample(value.shape[0])].float().T
        self._expect.setdefault(key, {})[index] = exp

    def verify(self, model: nn.Module, *, require_complete: bool = True) -> VerifyReport:
        """Check the loaded ``model`` against the recorded expectations; raise WeightMismatchError naming the first
        bad tensor."""
        if self._unplaced:
            first = sorted(self._unplaced)[0]
            raise WeightMismatchError(f"received tensor {first!r} matches no parameter of the model", tensor=first)
        t0 = time.perf_counter()
        report = VerifyReport(observe_seconds=self._observe_seconds)
        for key in self._keys:
            target = self._targets[key]
            got = self._expect.get(key, {})
            if not got and not require_complete:
                continue
            missing = [p for i, p in enumerate(target.parts) if i not in got]
            if missing:
                what = "left out of the update" if not got else f"missing from the fused parameter {key!r}"
                raise WeightMismatchError(f"tensor {missing[0]!r} {what}", tensor=missing[0])
            expects = [got[i] for i in range(len(target.parts))]
            rows = [e.shape[0] if e.shape else 1 for e in expects]
            if target.sizes and rows != target.sizes:
                raise WeightMismatchError(
                    f"fused parameter {key!r} expects rows {target.sizes}, received {rows}", tensor=target.parts[0]
                )
            if key not in self._due:
                report.deferred += len(expects)
                continue
            module = model.get_submodule(target.module)
            param = getattr(module, target.leaf)
            if self._readable(param, expects, sum(rows)) and all(e.digest is not None for e in expects):
                self._check_bitwise(target, param, expects, rows)
                report.bitwise += len(expects)
            elif target.probe and all(e.onehot is not None for e in expects):
                self._check_probe(target, module, expects, rows)
                report.probed += len(expects)
            else:
                report.unverified.append(key)
        if report.unverified:
            logger.warning(
                "weight load not verifiable for %d parameters: %s", len(report.unverified), report.unverified
            )
        report.verify_seconds = time.perf_counter() - t0
        self._full_next = False
        return report

    @staticmethod
    def _readable(param: torch.Tensor, expects: list[_Expect], total_rows: int) -> bool:
        if param.is_meta or param.numel() == 0:
            return False
        shape = expects[0].shape
        if len(expects) == 1 and not shape:
            return tuple(param.shape) == shape
        return param.dim() == len(shape) and tuple(param.shape[1:]) == shape[1:] and param.shape[0] >= total_rows

    def _check_bitwise(self, target: _Target, param: torch.Tensor, expects: list[_Expect], rows: list[int]) -> None:
        offset = 0
        for name, exp, n in zip(target.parts, expects, rows, strict=True):
            held = param.detach() if not exp.shape else param.detach().narrow(0, offset, n)
            digest = digest_tensor(name, held.to(self.device), str(target.dtype), self.algo)
            if digest != exp.digest:
                raise WeightMismatchError(
                    f"tensor {name!r}: the model holds different values than were received (load had no effect)",
                    tensor=name,
                )
            offset += n

    def _check_probe(self, target: _Target, module: nn.Module, expects: list[_Expect], rows: list[int]) -> None:
        cols, dense = self._probe_inputs(expects[0].shape[1], target.dtype)
        eye = torch.zeros(len(cols), expects[0].shape[1], dtype=target.dtype, device=self.device)
        eye[torch.arange(len(cols), device=self.device), cols] = 1
        method: Any = module.quant_method
        with torch.no_grad():
            out = method.apply(module, torch.cat([eye, dense]), None).float()
        tol = _DENSE_RTOL.get(target.dtype, _DENSE_RTOL_DEFAULT)
        offset = 0
        for name, exp, n in zip(target.parts, expects, rows, strict=True):
            assert exp.onehot is not None and exp.dense is not None
            got_onehot = out[: len(cols), offset : offset + n]
            got_dense = out[len(cols) :, offset : offset + n][:, self._probe_row_sample(n)]
            onehot_err = float((got_onehot - exp.onehot).abs().max()) if n else 0.0
            dense_err = float((got_dense - exp.dense).abs().max()) if n else 0.0
            onehot_ok = onehot_err <= _ONEHOT_RTOL * (float(exp.onehot.abs().max()) if n else 0.0)
            dense_ok = dense_err <= tol * (float(exp.dense.abs().max()) if n else 0.0) + 1e-30
            if not (onehot_ok and dense_ok):
                raise WeightMismatchError(
                    f"tensor {name!r}: the layer's output disagrees with the received weights "
                    f"(column error {onehot_err:.3g}, dense error {dense_err:.3g}): load had no effect or was partial",
                    tensor=name,
                )
            offset += n

    def _probe_row_sample(self, out_rows: int) -> torch.Tensor:
        """The fixed sample of output rows the dense probe checks in a part of ``out_rows`` rows (all, if few)."""
        if out_rows not in self._rows:
            gen = torch.Generator().manual_seed(self.seed * 1_000_033 + out_rows)
            rows = torch.randperm(out_rows, generator=gen)[: self.probe_rows].sort().values
            self._rows[out_rows] = rows.to(self.device)
        return self._rows[out_rows]

    def _probe_inputs(self, in_features: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed probe columns and one dense row for layers with ``in_features`` inputs, in the layer's dtype."""
        key = (in_features, dtype)
        if key not in self._inputs:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + in_features)
            cols = torch.randperm(in_features, generator=gen)[: self.probe_columns]
            dense = torch.randn(1, in_features, generator=gen).to(dtype)
            self._inputs[key] = (cols.to(self.device), dense.to(self.device))
        return self._inputs[key]
