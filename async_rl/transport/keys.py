"""Make CURVE key pairs for a rollout plane that binds beyond loopback: ``python -m async_rl.transport.keys DIR``.

Layout written under DIR (existing files are never overwritten):

    DIR/server.key             coordinator public key   -> actors: async_training.transport.curve_server_public_key
    DIR/server.key_secret      coordinator key pair     -> coordinator: async_training.transport.curve_server_secret_key
    DIR/clients/NAME.key_secret  one key pair per actor -> that actor: async_training.transport.curve_client_secret_key
    DIR/authorized/NAME.key    the actors' public keys  -> coordinator: async_training.transport.curve_client_keys_dir

Copy only what each machine needs; to revoke an actor delete its file from ``authorized/`` and restart the
coordinator. Secret files are created with mode 0600.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import zmq.auth

SECTION = "async_training.transport"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _create_pair(dest_dir: Path, name: str) -> tuple[Path, Path]:
    with tempfile.TemporaryDirectory() as tmp:
        public_tmp, secret_tmp = zmq.auth.create_certificates(tmp, name)
        dest_dir.mkdir(parents=True, exist_ok=True)
        public, secret = dest_dir / f"{name}.key", dest_dir / f"{name}.key_secret"
        shutil.move(public_tmp, public)
        shutil.move(secret_tmp, secret)
    os.chmod(secret, 0o600)
    return public, secret


def make_keys(directory: str | os.PathLike[str], clients: list[str]) -> dict[str, Path]:
    """Create the server pair and one pair per client name; returns the paths to configure (see module doc)."""
    root = Path(directory)
    if not clients:
        raise ValueError("clients must name at least one actor key")
    for name in clients:
        if not _NAME.match(name) or name == "server":
            raise ValueError(f"client name {name!r} must match {_NAME.pattern} and not be 'server'")
    if len(set(clients)) != len(clients):
        raise ValueError(f"client names repeat: {clients}")
    targets = [root / "server.key", root / "server.key_secret"]
    targets += [root / "clients" / f"{n}.key_secret" for n in clients] + [
        root / "authorized" / f"{n}.key" for n in clients
    ]
    existing = [str(p) for p in targets if p.exists()]
    if existing:
        raise ValueError(f"refusing to overwrite existing key files: {existing}")
    root.mkdir(parents=True, exist_ok=True)
    _create_pair(root, "server")
    out: dict[str, Path] = {
        f"{SECTION}.curve_server_public_key": root / "server.key",
        f"{SECTION}.curve_server_secret_key": root / "server.key_secret",
        f"{SECTION}.curve_client_keys_dir": root / "authorized",
    }
    for name in clients:
        public, secret = _create_pair(root / "clients", name)
        (root / "authorized").mkdir(parents=True, exist_ok=True)
        shutil.move(public, root / "authorized" / f"{name}.key")
        out[f"{SECTION}.curve_client_secret_key[{name}]"] = secret
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m async_rl.transport.keys", description=__doc__.split("\n")[0])
    parser.add_argument("directory", help="where to write the keys")
    parser.add_argument("--clients", type=int, default=1, help="number of actor key pairs (actor-0, actor-1, ...)")
    parser.add_argument("--names", nargs="*", default=None, help="explicit actor key names instead of --clients")
    args = parser.parse_args(argv)
    names = args.names if args.names else [f"actor-{i}" for i in range(args.clients)]
    try:
        paths = make_keys(args.directory, names)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for key, path in paths.items():
        print(f"{key} = {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
