"""SFT on the tiny model in one process (fp32, one thread): the first step's loss is the token-mean negative
log-likelihood of the demonstrated tokens computed by plain transformers; training lowers the held-out loss and
exports a causal LM; a run stopped by SIGTERM after step 3 and resumed trains steps 4..6 exactly as an uninterrupted
run (losses, final weights); LoRA trains adapters only and exports them merged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from async_rl import metric_catalog as mc
from async_rl.config.sft import load_sft_config
from async_rl.learner.checkpoint import list_checkpoints
from async_rl.learner.dist import local_context
from async_rl.runtime.graceful_stop import GracefulStop
from async_rl.runtime.metrics import read_metrics
from async_rl.runtime.sft_trainer import SFTTrainer, format_sft_line
from async_rl.runtime.supervised import CHECKPOINT_DIR, EXPORT_DIR

REPO = Path(__file__).resolve().parents[2]
STEPS = 6


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def demos(tmp_path: Path) -> Path:
    """20 plain-text rows (8 a step: 2 steps an epoch, so a resume after step 3 lands mid-epoch)."""
    path = tmp_path / "demos.jsonl"
    rows = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a in range(5) for b in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _trainer(out: Path, demos: Path, *overrides: str, stop: GracefulStop | None = None) -> SFTTrainer:
    cfg, _ = load_sft_config(
        [str(REPO / "configs" / "sft" / "tiny_arith.yaml")],
        [
            f"trainer.default_local_dir={out}",
            "model.mixed_precision.param_dtype=fp32",
            f"data.train_files={demos}",
            f"data.val_files={demos}",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_gpu=3",  # 3 + 3 + 2: uneven micro-batches
            f"trainer.total_training_steps={STEPS}",
            "trainer.test_freq=0",
            "trainer.logger=[jsonl]",
            *overrides,
        ],
    )
    return SFTTrainer(cfg, local_context(torch.device("cpu")), stop)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r[mc.SFT_TRAIN_LOSS] for r in read_metrics(out / "metrics.jsonl")}


def test_the_first_loss_is_the_demonstrated_tokens_nll_and_training_lowers_the_held_out_loss(
    tmp_path: Path, demos: Path
) -> None:
    from transformers import AutoModelForCausalLM

    trainer = _trainer(tmp_path / "run", demos, "trainer.total_training_steps=30", "optim.lr=3e-3")
    rows = trainer.order(0)[:8]
    # by hand, before any update: -mean log p(response token | everything before it) over the step's answer+EOS tokens
    base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "tiny-arith"), dtype=torch.float32)
    nll, count = 0.0, 0
    for i in rows:
        ex = trainer.train_data.examples[i]
        ids = torch.tensor([ex.prompt_ids + ex.response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(base(input_ids=ids).logits[0, :-1].double(), dim=-1)
        targets = ids[0, 1:]
        token_logp = logp.gather(1, targets[:, None])[:, 0][len(ex.prompt_ids) - 1 :]
        nll -= float((token_logp * torch.tensor(ex.loss_mask, dtype=torch.float64)).sum())
        count += sum(ex.loss_mask)
    before = trainer.evaluate()[mc.SFT_VAL_LOSS]
    summary = trainer.train()
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    first, last = lines[0], lines[-1]
    assert all(mc.record_kind(r) == "sft" and mc.unknown_keys(r, "sft") == [] for r in lines)  # every key catalogued
    assert first[mc.SFT_TRAIN_LOSS] == pytest.approx(nll / count, rel=1e-5)
    assert first[mc.SFT_TRAIN_TRAINED_TOKENS] == count
    assert last[mc.SFT_VAL_LOSS] < 0.8 * before  # validated after the last step
    assert last[mc.SFT_VAL_PERPLEXITY] == pytest.approx(torch.tensor(last[mc.SFT_VAL_LOSS]).exp().item())
    assert last[mc.SFT_VAL_TOKENS] == sum(ex.trained_tokens for ex in trainer.val_data.examples)
    assert [r[mc.SFT_EPOCH] for r in lines[:3]] == [0.0, 0.0, 1.0]
    assert summary["export"] == str(tmp_path / "run" / EXPORT_DIR)
    tuned = AutoModelForCausalLM.from_pretrained(summary["export"], dtype=torch.float32)
    ex = trainer.train_data.examples[0]
    with torch.no_grad():  # the exported model is the trained one: its loss on a row is below the base model's
        ids = torch.tensor([ex.prompt_ids + ex.response_ids])
        labels = ids.clone()
        labels[0, : len(ex.prompt_ids)] = -100
        assert float(tuned(input_ids=ids, labels=labels).loss) < float(base(input_ids=ids, labels=labels).loss)
    line = format_sft_line(30, 30, last)
    assert line.startswith("step 30/30 | loss ") and "| val loss " in line


def test_label_smoothing_spreads_eps_over_the_ordinary_tokens(tmp_path: Path, demos: Path) -> None:
    from transformers import AutoModelForCausalLM

    from async_rl.data.sft import smoothing_token_ids

    eps = 0.3
    trainer = _trainer(
        tmp_path / "run", demos, "trainer.total_training_steps=1", f"trainer.label_smoothing_factor={eps}"
    )
    tok = trainer.tokenizer
    smooth = smoothing_token_ids(tok)
    base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "tiny-arith"), dtype=torch.float32)
    # no mass on pad/bos/eos/unk, nor on the embedding rows past the tokenizer
    assert not set(smooth) & set(tok.all_special_ids) and tok.eos_token_id not in smooth
    assert tok.convert_tokens_to_ids("7") in smooth
    assert len(smooth) < len(tok) <= base.config.vocab_size
    # by hand: (1 - eps) * -log p(target) + eps * mean over the ordinary tokens of -log p, token mean over the step
    total, count = 0.0, 0
    for i in trainer.order(0)[:8]:
        ex = trainer.train_data.examples[i]
        ids = torch.tensor([ex.prompt_ids + ex.response_ids])
        logp = torch.log_softmax(base(input_ids=ids).logits[0, :-1].double(), dim=-1)[len(ex.prompt_ids) - 1 :]
        targets = ids[0, len(ex.prompt_ids) :]
        per_token = (1 - eps) * -logp.gather(1, targets[:, None])[:, 0] + eps * -logp[:, smooth].mean(-1)
        total += float((per_token * torch.tensor(ex.loss_mask, dtype=torch.float64)).sum())
        count += sum(ex.loss_mask)
    trainer.train()
    first = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert first[mc.SFT_TRAIN_LOSS] == pytest.approx(total / count, rel=1e-5)


def test_a_stopped_run_resumes_exactly(tmp_path: Path, demos: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _trainer(tmp_path / "whole", demos)
    assert whole.steps_per_epoch == 2
    whole.train()
    expected = _losses(tmp_path / "whole")
    assert sorted(expected) == list(range(1, STEPS + 1))

    run = tmp_path / "run"
    stop = GracefulStop(deadline_s=600.0)
    try:
        first = _trainer(run, demos, "trainer.save_freq=2", stop=stop)
        step = first.step

        def signal_during_step_3(index: int, order: list[int]) -> dict[str, float]:
            if index == 2:
                stop.request()
            return step(index, order)

        monkeypatch.setattr(first, "step", signal_during_step_3)
        summary = first.train()
    finally:
        stop.close()
    ckpts = run / CHECKPOINT_DIR
    assert summary == {"stopped": True, "steps": 3, "checkpoint": str(ckpts / "step_3")}
    assert [s for s, _ in list_checkpoints(ckpts)] == [2, 3] and not (run / EXPORT_DIR).exists()
    resumed = _trainer(run, demos, "trainer.save_freq=2")
    assert resumed.start_step == 3
    resumed.train()
    assert _losses(run) == expected  # bit-identical (one thread, fp32)
    w_whole = load_file(str(tmp_path / "whole" / EXPORT_DIR / "model.safetensors"))
    w_resumed = load_file(str(run / EXPORT_DIR / "model.safetensors"))
    assert sorted(w_whole) == sorted(w_resumed) and all(torch.equal(w_whole[k], w_resumed[k]) for k in w_whole)
    with pytest.raises(ValueError, match=r"training rows: 20 then, 19 now"):
        fewer = tmp_path / "fewer.jsonl"
        fewer.write_text("".join(demos.read_text().splitlines(keepends=True)[:19]))
        _trainer(run, fewer, "trainer.save_freq=2")


def test_lora_trains_adapters_only_and_exports_them_merged(tmp_path: Path, demos: Path) -> None:
    trainer = _trainer(tmp_path / "run", demos, "model.lora_rank=4", "optim.lr=1e-2", "trainer.total_training_steps=4")
    trained = {n for n, p in trainer.model.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    summary = trainer.train()
    losses = _losses(tmp_path / "run")
    assert losses[4] < losses[1]
    base = load_file(str(tmp_path / "run" / "tiny-arith" / "model.safetensors"))
    merged = load_file(str(Path(summary["export"]) / "model.safetensors"))
    assert sorted(merged) == sorted(base)  # plain weights under the base model's names: the adapters are merged in
    changed = [k for k in base if not torch.equal(base[k], merged[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)
