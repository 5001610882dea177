"""A distillation teacher must map every token to the student's id (runtime.resources.check_same_vocabulary, run by
the actor for a teacher engine and by the learner for a teacher of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_rl.runtime.resources import check_same_vocabulary, resolve_model_path


def test_a_distillation_teacher_needs_the_students_vocabulary(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from async_rl.models.tiny import build_tiny_model

    tiny = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "a", seed=0))
    same = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "b", seed=1, init_std=0.3))
    check_same_vocabulary(tiny, same, teacher_path="b")  # other weights, the same tokenizer: fine
    other = AutoTokenizer.from_pretrained(resolve_model_path("builtin:smollm2-135m-instruct", tmp_path))
    with pytest.raises(ValueError, match=r"distillation.teacher_model.model_path='smol' has another tokenizer"):
        check_same_vocabulary(tiny, other, teacher_path="smol")
