"""End-to-end weight sync into a running vLLM CPU engine (one engine shared by the whole file).

A separate learner stand-in process (``sender_proc.py``) broadcasts weights over gloo; the engine receives them
through vLLM's native weight-transfer API with this package's registered engine. Checks: after a good update vLLM's
per-token log-probs equal a transformers forward pass on the same weights; a corrupted digest, a tensor left out of
the update and a sender that never sends are each detected and raised as the right exception.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

vllm = pytest.importorskip("vllm")

from async_rl.models import build_tiny_model  # noqa: E402
from async_rl.transport.protocol import WeightSyncPlan  # noqa: E402
from async_rl.weight_sync import EngineWeightSync, WeightSyncError, WeightSyncTimeout, vllm_engine_kwargs  # noqa: E402
from async_rl.weight_sync.group import resolve_backend  # noqa: E402
from async_rl.weight_sync.membership import JoinInfo  # noqa: E402

pytestmark = pytest.mark.slow

SENDER = Path(__file__).with_name("sender_proc.py")
REPO = Path(__file__).resolve().parents[2]
SEQUENCES = [[5, 6, 14, 11, 18, 5, 13], [28, 29, 30, 23, 7, 16, 8, 18, 9, 10, 27]]  # token ids of the char vocab


def _load_sender_module() -> Any:
    spec = importlib.util.spec_from_file_location("ws_sender_proc", SENDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> Iterator[Any]:
    old = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    os.environ["ASYNC_RL_CPU_SAMPLER"] = "inverse_cdf"  # opt-in; its processes read it when they start
    engine = vllm.LLM(
        model=str(model_dir),
        enforce_eager=True,
        dtype="float32",
        max_model_len=128,
        seed=0,
        max_logprobs=64,  # the tiny model's whole vocabulary (the sampler test reads the full distribution)
        **vllm_engine_kwargs(),
    )
    yield engine
    os.environ.pop("ASYNC_RL_CPU_SAMPLER", None)
    engine.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()
    if old is None:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    else:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = old


def _fixed_group(port: int, *, epoch: int = 0, timeout_s: float = 60.0) -> JoinInfo:
    """The engine at rank 1 of a fixed group of two with the sender stand-in (it builds no roster)."""
    plan = WeightSyncPlan(
        host="127.0.0.1", port=port, backend=resolve_backend(backend="auto"), timeout_s=timeout_s, join_timeout_s=10.0,
        version=-1, epoch=epoch, candidates=(),
    )  # fmt: skip
    return JoinInfo(plan=plan, world_size=2, rank_offset=1)


def _start_sender(model_dir: Path, mode: str, *, version: int, timeout: float, **extra: Any) -> tuple[Any, int]:
    cmd = [sys.executable, str(SENDER), "--model", str(model_dir), "--mode", mode]
    cmd += ["--version", str(version), "--timeout", str(timeout)]
    for key, value in extra.items():
        flag = f"--{key.replace('_', '-')}"
        cmd += [flag] if value is True else [flag, str(value)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), f"sender did not start: {line!r}"
    return proc, int(line.split()[1])


def _sender_output(proc: Any) -> str:
    out, _ = proc.communicate(timeout=120)
    return str(out)


def _vllm_logprobs(llm: Any) -> list[torch.Tensor]:
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outs = llm.generate([{"prompt_token_ids": seq} for seq in SEQUENCES], params, use_tqdm=False)
    # prompt_logprobs[i] (i >= 1) holds the log-prob of the actual prompt token i given tokens < i.
    return [
        torch.tensor([next(iter(d.values())).logprob for d in out.prompt_logprobs[1:]], dtype=torch.float64)
        for out in outs
    ]


def _hf_logprobs(model_dir: Path, weights: dict[str, torch.Tensor] | None) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if weights is not None:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        tied = ["lm_head.weight"] if model.config.tie_word_embeddings else []  # transformers ties it to the embedding
        assert missing == tied and not unexpected, (missing, unexpected)
    out = []
    with torch.no_grad():
        for seq in SEQUENCES:
            ids = torch.tensor([seq])
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
            out.append(logp.gather(1, ids[0, 1:, None])[:, 0])
    return out


def _good_update(llm: Any, model_dir: Path, *, seed: int, version: int, rotation: int = 1) -> dict[str, Any]:
    proc, port = _start_sender(model_dir, "good", version=version, timeout=60, seed=seed)
    sync = EngineWeightSync(llm, verify_rotation=rotation)
    sync.join(_fixed_group(port))
    report = sync.update(version)
    out = _sender_output(proc)
    assert proc.returncode == 0 and "REPORT" in out, out
    return report


@pytest.mark.skipif(torch.cuda.is_available(), reason="the sampler is replaced in vLLM's CPU build only")
def test_cpu_workers_draw_from_the_models_distribution_with_the_inverse_cdf(llm: Any) -> None:
    """The worker extension put ``actor/cpu_sampler.py`` in the engine's sampler; 4,000 draws of one next token at
    temperature 1 follow the log-probs vLLM reports for it (chi-square at p = 1e-4), and a seed repeats its draws."""
    from tests.actor.test_cpu_sampler import chi2, chi2_bound

    assert llm.collective_rpc("cpu_sampler_state") == [{"installed": True, "in_use": True}]
    prompt = {"prompt_token_ids": SEQUENCES[0]}
    probe = llm.generate([prompt], vllm.SamplingParams(max_tokens=1, logprobs=64, temperature=1.0), use_tqdm=False)
    logprobs = probe[0].outputs[0].logprobs[0]
    probs = torch.zeros(64, dtype=torch.float64)
    for token, entry in logprobs.items():
        probs[token] = torch.tensor(entry.logprob, dtype=torch.float64).exp()
    assert abs(float(probs.sum()) - 1.0) < 1e-4
    draws = vllm.SamplingParams(n=4000, max_tokens=1, temperature=1.0, seed=5)
    out = llm.generate([prompt], draws, use_tqdm=False)[0].outputs
    tokens = torch.tensor([o.token_ids[0] for o in out])
    stat, dof = chi2(tokens, probs)
    assert dof >= 3 and stat < chi2_bound(dof), (stat, dof)
    again = llm.generate([prompt], vllm.SamplingParams(n=50, max_tokens=1, temperature=1.0, seed=5), use_tqdm=False)
    repeat = llm.generate([prompt], vllm.SamplingParams(n=50, max_tokens=1, temperature=1.0, seed=5), use_tqdm=False)
    assert [o.token_ids for o in again[0].outputs] == [o.token_ids for o in repeat[0].outputs]


def test_update_matches_transformers_forward(llm: Any, model_dir: Path) -> None:
    before = _vllm_logprobs(llm)
    report = _good_update(llm, model_dir, seed=1, version=1)
    # 27 checkpoint tensors: embed + lm_head + final norm = 3, plus 12 per layer x 2 layers
    # (q/k/v weight+bias = 6, o_proj, gate/up/down = 4, two norms = 2).
    assert report["tensors"] == 27
    # Every tensor was checked after loading: bit for bit where vLLM keeps the weight, by probing the kernel where
    # it repacked it (CPU linear weights: 4 weights x 2 layers, q/k/v + gate/up count one per part -> 7 x 2 = 14).
    assert report["verified_bitwise"] + report["verified_probe"] == 27
    assert report["verified_probe"] == 14 and report["unverified"] == []
    after = _vllm_logprobs(llm)
    weights = _load_sender_module().perturbed_weights(str(model_dir), 1, 0.05)
    reference = _hf_logprobs(model_dir, weights)
    for got, want, old in zip(after, reference, before, strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
        assert (got - old).abs().max() > 1e-2  # the update changed the model
    state = EngineWeightSync(llm, verify_rotation=1).state()
    assert state["weights_valid"] is True and state["last_error"] is None
    # Rotation 2 (async_training.weight_sync.verify_rotation): after a verified update, two updates check the values
    # of complementary halves of the parameters, the rest deferred; together every one of the 27 parts once.
    halves = [_good_update(llm, model_dir, seed=seed, version=seed, rotation=2) for seed in (2, 3)]
    checked = [r["verified_bitwise"] + r["verified_probe"] for r in halves]
    assert [c + r["verify_deferred"] for c, r in zip(checked, halves, strict=True)] == [27, 27]
    assert sum(checked) == 27 and min(checked) > 0


def test_a_tied_output_layer_computes_with_the_updated_embedding(tmp_path: Path) -> None:
    """SmolLM2 and Qwen2.5-0.5B tie their output layer to the embedding. vLLM's CPU build packs the output layer's
    matmul from the weight when it processes the layer, and a reload does not process it again (it loads nothing of
    its own): before ``actor/tied_weights.py`` re-processed it, the engine served the updated model through its original
    output layer, log-probs up to 1.2 nats off a transformers forward of the same weights."""
    model_dir = build_tiny_model(tmp_path / "tied", seed=0, tie_word_embeddings=True)
    engine = vllm.LLM(
        model=str(model_dir), enforce_eager=True, dtype="float32", max_model_len=128, seed=0, **vllm_engine_kwargs()
    )
    try:
        before = _vllm_logprobs(engine)
        report = _good_update(engine, model_dir, seed=1, version=1)
        assert report["tensors"] == 26  # the tied weight is sent once, as the embedding
        after = _vllm_logprobs(engine)
    finally:
        engine.llm_engine.engine_core.shutdown()
        del engine
        gc.collect()
    reference = _hf_logprobs(model_dir, _load_sender_module().perturbed_weights(str(model_dir), 1, 0.05))
    for got, want, old in zip(after, reference, before, strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
        assert (got - old).abs().max() > 1e-2  # the update changed the model


def test_a_held_update_changes_nothing_served_until_it_is_loaded(llm: Any, model_dir: Path) -> None:
    """The actor's hold-back path (stage_weights / load_staged_weights): receive in full while serving, load later."""
    sync = EngineWeightSync(llm, verify_rotation=1)
    before, valid = _vllm_logprobs(llm), sync.state()["weights_valid"]
    # a corrupted transfer of a held update fails, and the served weights stay exactly as they were
    proc, port = _start_sender(
        model_dir, "corrupt_digest", version=6, timeout=60, target="model.layers.0.mlp.down_proj.weight", seed=6
    )
    sync.join(_fixed_group(port))
    with pytest.raises(WeightSyncError, match="digest mismatch"):
        sync.stage(6)
    _sender_output(proc)
    assert sync.state()["weights_valid"] is valid
    assert all(torch.equal(a, b) for a, b in zip(_vllm_logprobs(llm), before, strict=True))
    # a good one is received and held: still nothing changes until it is loaded
    proc, port = _start_sender(model_dir, "good", version=7, timeout=60, seed=7)
    sync.join(_fixed_group(port))
    held = sync.stage(7)
    out = _sender_output(proc)
    assert proc.returncode == 0 and "REPORT" in out, out
    assert held["staged"] is True and held["version"] == 7 and held["tensors"] == 27
    assert all(torch.equal(a, b) for a, b in zip(_vllm_logprobs(llm), before, strict=True))
    loaded = sync.load_staged(7)
    assert loaded["verified_bitwise"] + loaded["verified_probe"] == 27 and loaded["unverified"] == []
    weights = _load_sender_module().perturbed_weights(str(model_dir), 7, 0.05)
    for got, want in zip(_vllm_logprobs(llm), _hf_logprobs(model_dir, weights), strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert sync.state()["weights_valid"] is True
    with pytest.raises(WeightSyncError, match="no staged update of version 7 to load \\(holding nothing\\)"):
        sync.load_staged(7)  # loaded once: released
    assert sync.state()["weights_valid"] is True


@pytest.mark.parametrize(
    ("mode", "target", "phrase"),
    [
        ("corrupt_digest", "model.layers.1.self_attn.k_proj.weight", "digest mismatch"),
        ("skip", "model.layers.0.mlp.up_proj.weight", "missing from the fused parameter"),
        ("skip", "model.norm.weight", "left out of the update"),
    ],
)
def test_bad_update_is_detected(llm: Any, model_dir: Path, mode: str, target: str, phrase: str) -> None:
    proc, port = _start_sender(model_dir, mode, version=2, timeout=60, target=target, seed=2)
    sync = EngineWeightSync(llm, verify_rotation=1)
    sync.join(_fixed_group(port))
    with pytest.raises(WeightSyncError) as info:
        sync.update(2)
    assert not isinstance(info.value, WeightSyncTimeout)
    assert info.value.tensor == target and phrase in str(info.value)
    assert sync.state()["weights_valid"] is False
    _sender_output(proc)


def test_hung_transfer_times_out_then_rejoins_under_a_new_epoch(llm: Any, model_dir: Path) -> None:
    # The learner stand-in joins epoch 0 and sends nothing for 8 s, then rejoins under epoch 1 and sends v4.
    proc, port = _start_sender(model_dir, "hang", version=4, timeout=60, seed=4, hang_s=8.0, then_good=True)
    sync = EngineWeightSync(llm, verify_rotation=1)
    sync.join(_fixed_group(port, epoch=0, timeout_s=2.0))
    t0 = time.perf_counter()
    with pytest.raises(WeightSyncTimeout):
        sync.update(4)
    elapsed = time.perf_counter() - t0
    assert 1.5 < elapsed < 7.0, elapsed  # the 2 s group timeout fired (not a hang, not the sender leaving at 8 s)
    state = sync.state()
    assert state["broken"] is True and state["weights_valid"] is False
    with pytest.raises(WeightSyncError, match="broken"):
        sync.update(4)  # a broken group refuses work until rejoined
    sync.join(_fixed_group(port, epoch=1))  # same learner store, next epoch
    report = sync.update(4)
    assert report["version"] == 4 and sync.state()["epoch"] == 1
    out = _sender_output(proc)
    assert proc.returncode == 0 and "REPORT" in out, out
    weights = _load_sender_module().perturbed_weights(str(model_dir), 4, 0.05)
    for got, want in zip(_vllm_logprobs(llm), _hf_logprobs(model_dir, weights), strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert json.dumps(report)  # the report is plain data (it crossed vLLM's msgpack IPC)
