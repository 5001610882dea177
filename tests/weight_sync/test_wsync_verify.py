"""LoadVerifier against a small stand-in of a vLLM model (fused q/k/v, CPU-style packed weights), no vLLM."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from async_rl.weight_sync.errors import WeightSyncError
from async_rl.weight_sync.verify import LoadVerifier

MAPPING = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}


class _Method:
    """Mimics vLLM's UnquantizedLinearMethod.apply: on 'CPU' the weight lives only in a packed copy."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        weight = layer.packed if layer.packed is not None else layer.weight
        return x @ weight.T.to(x.dtype)


class _Linear(nn.Module):
    def __init__(self, in_features: int, sizes: list[int], bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_size = in_features
        self.output_sizes = sizes
        self.quant_method = _Method()
        self.packed: torch.Tensor | None = None
        self.weight = nn.Parameter(torch.zeros(sum(sizes), in_features, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(sum(sizes), dtype=dtype), requires_grad=False) if bias else None

    def pack(self) -> None:  # what vLLM's CPU backend does after loading: keep a packed copy, empty the parameter
        self.packed = self.weight.detach().clone()
        self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype), requires_grad=False)


class _Attn(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.qkv_proj = _Linear(8, [8, 4, 4], True, dtype)
        self.o_proj = _Linear(8, [8], False, dtype)


class _Block(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = _Attn(dtype)
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(8, dtype=dtype), requires_grad=False)


class _Model(nn.Module):
    packed_modules_mapping = MAPPING

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Block(dtype)])


def _checkpoint(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {
        "layers.0.self_attn.q_proj.weight": (8, 8),
        "layers.0.self_attn.k_proj.weight": (4, 8),
        "layers.0.self_attn.v_proj.weight": (4, 8),
        "layers.0.self_attn.q_proj.bias": (8,),
        "layers.0.self_attn.k_proj.bias": (4,),
        "layers.0.self_attn.v_proj.bias": (4,),
        "layers.0.self_attn.o_proj.weight": (8, 8),
        "layers.0.norm.weight": (8,),
    }
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def _load(model: _Model, weights: dict[str, torch.Tensor], skip: str | None = None) -> None:
    """A stand-in for vLLM's load_weights: fused parts go to their row ranges (q: 0-8, k: 8-12, v: 12-16)."""
    rows = {"q_proj": (0, 8), "k_proj": (8, 12), "v_proj": (12, 16)}
    for name, value in weights.items():
        if name == skip:
            continue
        module_path, leaf = name.rsplit(".", 1)
        parent, last = module_path.rsplit(".", 1)
        if last in rows:
            lo, hi = rows[last]
            getattr(model.get_submodule(f"{parent}.qkv_proj"), leaf).data[lo:hi] = value
        else:
            getattr(model.get_submodule(module_path), leaf).data.copy_(value)


def _pack(model: _Model) -> None:
    model.layers[0].self_attn.qkv_proj.pack()
    model.layers[0].self_attn.o_proj.pack()


@pytest.mark.parametrize("packed", [False, True])
def test_complete_load_verifies(packed: bool) -> None:
    model = _Model()
    verifier = LoadVerifier(model, device="cpu", seed=0)
    weights = _checkpoint(1)
    for name, value in weights.items():
        verifier.observe(name, value)
    _load(model, weights)
    if packed:
        _pack(model)
    report = verifier.verify(model)
    # 8 checkpoint tensors. Readable model: all 8 bit for bit. Packed: the 4 linear weights (q, k, v, o) are probed,
    # the 3 biases and the norm (4) are still compared bit for bit.
    assert (report.bitwise, report.probed) == ((4, 4) if packed else (8, 0))
    assert report.unverified == []


def _rematerialize(model: _Model) -> None:
    """What a layer-wise reload does before loading: fresh full-size (zero) linear weights, no packed copy."""
    for linear in (model.layers[0].self_attn.qkv_proj, model.layers[0].self_attn.o_proj):
        linear.weight = nn.Parameter(torch.zeros(sum(linear.output_sizes), linear.input_size), requires_grad=False)
        linear.packed = None


def test_verifier_built_on_a_packed_model_probes_instead_of_digesting() -> None:
    # vLLM on CPU: the verifier is built after start-up, when linear weights are already packed away.
    model = _Model()
    _load(model, _checkpoint(1))
    _pack(model)
    verifier = LoadVerifier(model, device="cpu", seed=0)
    weights = _checkpoint(2)
    for name, value in weights.items():
        verifier.observe(name, value)
    _rematerialize(model)
    _load(model, weights, skip="layers.0.self_attn.q_proj.weight")  # q rows stay zero: a partial load
    _pack(model)
    with pytest.raises(WeightSyncError, match="disagrees") as info:
        verifier.verify(model)
    assert info.value.tensor == "layers.0.self_attn.q_proj.weight"
    _rematerialize(model)
    _load(model, weights)
    _pack(model)
    report = verifier.verify(model)
    assert (report.bitwise, report.probed) == (4, 4)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize(
    "skipped", ["layers.0.self_attn.k_proj.weight", "layers.0.self_attn.o_proj.weight", "layers.0.norm.weight"]
)
def test_received_but_not_loaded_is_detected(packed: bool, skipped: str) -> None:
    model = _Model()
    _load(model, _checkpoint(1))  # the weights of a previous version
    if packed:
        _pack(model)
        model = _Model()  # vLLM re-materialises layers on reload; start from a fresh stand-in
        _load(model, _checkpoint(1))
    verifier = LoadVerifier(model, device="cpu", seed=0)
    weights = _checkpoint(2)
    for name, value in weights.items():
        verifier.observe(name, value)
    _load(model, weights, skip=skipped)  # one tensor silently not applied: the model keeps its old value
    if packed:
        _pack(model)
    with pytest.raises(WeightSyncError, match="load had no effect") as info:
        verifier.verify(model)
    assert info.value.tensor == skipped


def test_missing_and_unplaced_tensors() -> None:
    model = _Model()
    verifier = LoadVerifier(model, device="cpu", seed=0)
    weights = _checkpoint(1)
    for name, value in weights.items():
        if name != "layers.0.self_attn.v_proj.bias":
            verifier.observe(name, value)
    _load(model, weights)
    with pytest.raises(WeightSyncError, match="missing from the fused parameter") as info:
        verifier.verify(model)
    assert info.value.tensor == "layers.0.self_attn.v_proj.bias"

    verifier.begin()
    verifier.observe("layers.0.norm.weight", weights["layers.0.norm.weight"])
    assert verifier.verify(model, require_complete=False).bitwise == 1
    with pytest.raises(WeightSyncError, match="left out of the update"):
        verifier.verify(model, require_complete=True)

    verifier.begin()
    verifier.observe("layers.0.mlp.up_proj.weight", torch.ones(2, 8))
    with pytest.raises(WeightSyncError, match="matches no parameter") as info:
        verifier.verify(model, require_complete=False)
    assert info.value.tensor == "layers.0.mlp.up_proj.weight"

    ignoring = LoadVerifier(model, device="cpu", ignore_names=["lm_head.weight"], seed=0)
    ignoring.observe("lm_head.weight", torch.ones(2, 8))  # e.g. tied embeddings: vLLM skips it on purpose
    assert ignoring.verify(model, require_complete=False).bitwise == 0


def test_dtype_cast_by_the_loader_is_expected() -> None:
    model = _Model(torch.bfloat16)  # fp32 checkpoint into a bf16 model: the loader rounds, the verifier does too
    verifier = LoadVerifier(model, device="cpu", seed=0)
    weights = _checkpoint(3)
    for name, value in weights.items():
        verifier.observe(name, value)
    _load(model, weights)
    _pack(model)
    report = verifier.verify(model)
    assert (report.bitwise, report.probed) == (4, 4)


def test_fused_rows_must_match_the_layer() -> None:
    model = _Model()
    verifier = LoadVerifier(model, device="cpu", seed=0)
    weights = _checkpoint(1)
    weights["layers.0.self_attn.k_proj.weight"] = torch.randn(5, 8)  # layer expects 4 rows of k
    for name, value in weights.items():
        if name.endswith("_proj.weight") and ".o_proj." not in name:
            verifier.observe(name, value)
    with pytest.raises(WeightSyncError, match=r"expects rows \[8, 4, 4\], received \[8, 5, 4\]"):
        verifier.verify(model, require_complete=False)


class _TiedModel(nn.Module):
    """Like vLLM's Llama with tie_word_embeddings: lm_head holds the *same* Parameter as embed_tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = nn.Parameter(torch.zeros(6, 8), requires_grad=False)
        self.lm_head = nn.Module()
        self.lm_head.weight = self.embed_tokens.weight


def test_tied_embeddings_are_one_tensor_sent_once() -> None:
    # Regression: the learner sends the tied weight once (as embed_tokens); the verifier used to demand lm_head too
    # ("tensor 'lm_head.weight' left out of the update") and the actor then paused forever.
    model = _TiedModel()
    verifier = LoadVerifier(model, device="cpu", ignore_names=["lm_head.weight"], seed=0)
    value = torch.randn(6, 8)
    verifier.observe("embed_tokens.weight", value)
    model.embed_tokens.weight.data.copy_(value)
    assert verifier.verify(model, require_complete=True).bitwise == 1
    assert "lm_head.weight" not in verifier.checkpoint_names

    verifier.begin()  # the tied weight missing altogether is still an error
    with pytest.raises(WeightSyncError, match="'embed_tokens.weight' left out of the update"):
        verifier.verify(model, require_complete=True)


def _packed_update(model: _Model, verifier: LoadVerifier, weights: dict[str, torch.Tensor], **load: str) -> None:
    """One update as vLLM on CPU runs it: observe as the tensors arrive, re-materialise, load, repack."""
    for name, value in weights.items():
        verifier.observe(name, value)
    _rematerialize(model)
    _load(model, weights, **load)
    _pack(model)


def test_rotation_checks_every_value_once_per_round_and_all_of_them_first() -> None:
    model = _Model()
    _load(model, _checkpoint(0))
    _pack(model)
    verifier = LoadVerifier(model, device="cpu", seed=0)
    counts = []
    for version in range(1, 6):
        verifier.begin(rotation=2)
        _packed_update(model, verifier, _checkpoint(version))
        report = verifier.verify(model)
        counts.append((report.bitwise, report.probed, report.deferred))
    # Sorted parameters: norm.weight, o_proj.weight, qkv_proj.bias, qkv_proj.weight (8 checkpoint parts). The first
    # update checks every value; then slot 0 (norm 1 + qkv bias 3, read back bit for bit) and slot 1 (o 1 + qkv
    # weight 3, probed through the kernel) take turns, the other half deferred.
    assert counts == [(4, 4, 0), (4, 0, 4), (0, 4, 4), (4, 0, 4), (0, 4, 4)]


def test_rotation_catches_a_persistently_dropped_tensor_within_one_round() -> None:
    model = _Model()
    _load(model, _checkpoint(0))
    _pack(model)
    verifier = LoadVerifier(model, device="cpu", seed=0)
    verifier.begin(rotation=2)
    _packed_update(model, verifier, _checkpoint(1))
    verifier.verify(model)
    dropped = "layers.0.self_attn.k_proj.weight"  # from here on the loader silently skips it (a name mismatch)
    verifier.begin(rotation=2)  # slot 0: the qkv weight's values wait, its structure is checked
    _packed_update(model, verifier, _checkpoint(2), skip=dropped)
    assert verifier.verify(model).deferred == 4
    verifier.begin(rotation=2)  # slot 1: caught
    _packed_update(model, verifier, _checkpoint(3), skip=dropped)
    with pytest.raises(WeightSyncError, match="disagrees") as info:
        verifier.verify(model)
    assert info.value.tensor == dropped
    verifier.begin(rotation=2)  # after a failed update every value is checked again, whatever the slot
    _packed_update(model, verifier, _checkpoint(4))
    assert verifier.verify(model).deferred == 0
    verifier.begin(rotation=2)
    _packed_update(model, verifier, _checkpoint(5))
    assert verifier.verify(model).deferred == 4


def test_rotation_still_checks_structure_of_deferred_parameters() -> None:
    model = _Model()
    verifier = LoadVerifier(model, device="cpu", seed=0)
    verifier.begin(rotation=4)
    weights = _checkpoint(1)
    for name, value in weights.items():
        verifier.observe(name, value)
    _load(model, weights)
    verifier.verify(model)
    verifier.begin(rotation=4)  # slot 0 is norm.weight only; the qkv bias is deferred but must still arrive whole
    weights = {k: v for k, v in _checkpoint(2).items() if k != "layers.0.self_attn.v_proj.bias"}
    for name, value in weights.items():
        verifier.observe(name, value)
    _load(model, weights)
    with pytest.raises(WeightSyncError, match="missing from the fused parameter") as info:
        verifier.verify(model)
    assert info.value.tensor == "layers.0.self_attn.v_proj.bias"
    with pytest.raises(ValueError, match="rotation must be >= 1"):
        verifier.begin(rotation=0)


def test_sampled_rows_still_catch_a_column_the_load_missed() -> None:
    # The dense probe compares a sample of each part's rows (here 2 of q's 8); a load that leaves one input column of
    # every row stale, outside the one-hot probe columns, still changes every sampled row's dot product.
    model = _Model()
    _load(model, _checkpoint(0))
    _pack(model)
    verifier = LoadVerifier(model, device="cpu", probe_columns=1, probe_rows=2, seed=0)
    verifier.begin()
    weights = _checkpoint(1)
    cols, _ = verifier._probe_inputs(8, torch.float32)
    stale = next(c for c in range(8) if c not in cols.tolist())
    for name, value in weights.items():
        verifier.observe(name, value)
    _rematerialize(model)
    _load(model, weights)
    q = model.layers[0].self_attn.qkv_proj.weight
    q.data[:8, stale] = _checkpoint(0)["layers.0.self_attn.q_proj.weight"][:, stale]
    _pack(model)
    with pytest.raises(WeightSyncError, match="disagrees") as info:
        verifier.verify(model)
    assert info.value.tensor == "layers.0.self_attn.q_proj.weight"
    assert "column error 0" in str(info.value)  # the one-hot column was right: the dense row sample caught it
