"""``python -m async_rl.config [--config FILE ...] [key=value ...]``: validate a config and print it resolved.

Handy to check a preset or a ported verl command line without starting anything (``--help`` lists every key).
"""

from __future__ import annotations

import logging
import sys

from async_rl.config.cli import format_config, parse_cli


def main(argv: list[str] | None = None) -> int:
    """Validate the config given on the command line and print it (warnings go to stderr)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    cfg, flags = parse_cli(argv)
    if not flags.print_config:
        sys.stdout.write(format_config(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
