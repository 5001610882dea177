"""Write the toy preference pairs (a correct one-digit sum chosen over a wrong one) as jsonl files, TRL's layout.

    python tools/make_toy_preferences.py --out data/toy_prefs           # plain text: "3+4=", "7" over "9"
    python tools/make_toy_preferences.py --out data/toy_prefs_chat --chat

Writes ``train.jsonl`` and ``val.jsonl`` under ``--out`` (no pair is in both); pass them as ``data.train_files`` and
``data.val_files``. The same pairs are built in as ``builtin:arith-prefs`` / ``builtin:arith-prefs-chat``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.data.toy_preferences import make_toy_preferences  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--chat", action="store_true", help="chat messages instead of plain text")
    parser.add_argument("--seed", type=int, default=1, help="seed of the pairs' order")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train.jsonl"), ("eval", "val.jsonl")):
        rows = make_toy_preferences(split=split, chat=args.chat, seed=args.seed)
        (args.out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{len(rows)} pairs -> {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
