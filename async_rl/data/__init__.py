"""Prompt data: the embedded arithmetic task and loaders for jsonl prompt files."""

from async_rl.data.arith import make_arith_problems, make_chat_arith_problems
from async_rl.data.files import load_prompt_records

__all__ = ["load_prompt_records", "make_arith_problems", "make_chat_arith_problems"]
