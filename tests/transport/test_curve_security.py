"""Binding policy and CURVE: loopback by default, no non-loopback bind without keys, and with keys only the
authorized client keys get anything through (an unknown key and a plaintext peer deliver nothing)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _plane_config import coordinator, plane_config

from async_rl.config import Config
from async_rl.config.async_training import TransportConfig
from async_rl.transport import Coordinator, RolloutClient
from async_rl.transport.keys import make_keys
from async_rl.transport.sockets import is_loopback


def fast(**overrides: Any) -> Config:
    """A test config with quick liveness: heartbeats every 0.1 s, a peer is dead after 1 s of silence."""
    return plane_config(heartbeat_interval_s=0.1, peer_timeout_s=1.0, **overrides)


REPO_ROOT = Path(__file__).resolve().parents[2]


def test_default_bind_is_loopback(coordinator_factory: Callable[..., Coordinator]) -> None:
    assert plane_config().async_training.transport.host == "127.0.0.1"
    assert coordinator_factory(2).address.startswith("tcp://127.0.0.1:")


@pytest.mark.parametrize("host", ["0.0.0.0", "*", "::", "10.1.2.3", "eth0"])
def test_non_loopback_bind_without_keys_refuses_to_start(host: str, make_records: Callable[..., list]) -> None:
    with pytest.raises(ValueError, match=r"python -m async_rl\.transport\.keys DIR"):
        coordinator(make_records(2), plane_config(host=host), seed=0).close()


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.9.9.9")
    assert not is_loopback("0.0.0.0") and not is_loopback("*") and not is_loopback("192.168.0.1")


def test_keys_cli_writes_the_documented_layout(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "async_rl.transport.keys", str(tmp_path / "k"), "--clients", "2"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "async_training.transport.curve_server_secret_key" in out.stdout
    for rel in ["server.key", "server.key_secret", "clients/actor-1.key_secret", "authorized/actor-0.key"]:
        assert (tmp_path / "k" / rel).is_file(), rel
    assert (tmp_path / "k" / "server.key_secret").stat().st_mode & 0o077 == 0  # secret: owner-only
    with pytest.raises(ValueError, match="overwrite"):
        make_keys(tmp_path / "k", ["actor-0"])


def test_curve_admits_only_authorized_keys(
    tmp_path: Path, coordinator_factory: Callable[..., Coordinator], client_factory: Callable[..., RolloutClient]
) -> None:
    make_keys(tmp_path / "keys", ["good"])
    make_keys(tmp_path / "rogue", ["evil"])  # a valid key pair the coordinator has never heard of
    keys, rogue = tmp_path / "keys", tmp_path / "rogue"
    server = fast(
        host="0.0.0.0",  # allowed now: CURVE is configured
        curve_server_secret_key=str(keys / "server.key_secret"),
        curve_client_keys_dir=str(keys / "authorized"),
    )
    coord = coordinator_factory(4, server)
    address = f"tcp://127.0.0.1:{coord.port}"

    def client_settings(secret: Path) -> Config:
        return fast(curve_server_public_key=str(keys / "server.key"), curve_client_secret_key=str(secret))

    unknown = client_factory(address, "evil", cfg=client_settings(rogue / "clients" / "evil.key_secret"))
    plaintext = client_factory(address, "plain", cfg=fast())
    for intruder in (unknown, plaintext):
        with pytest.raises(TimeoutError):
            intruder.hello(timeout_s=1.0)
        assert intruder.request_work(4, 0, timeout_s=0.2) == []
    good = client_factory(address, "good", cfg=client_settings(keys / "clients" / "good.key_secret"))
    assert good.hello(timeout_s=5.0).policy_version == 0
    time.sleep(0.2)
    m = coord.metrics()
    assert m["transport/actors_alive"] == 1  # only "good": nothing from the intruders got through
    assert m["transport/decode_errors_total"] == 0  # they were stopped at the handshake, not at decoding


def test_curve_settings_must_be_complete(tmp_path: Path, make_records: Callable[..., list]) -> None:
    records = make_records(2)
    make_keys(tmp_path / "k", ["a"])
    with pytest.raises(ValueError, match="curve_client_keys_dir"):
        coordinator(records, plane_config(curve_server_secret_key=str(tmp_path / "k" / "server.key_secret")), seed=0)
    with pytest.raises(ValueError, match="no secret key"):
        coordinator(
            records,
            plane_config(
                curve_server_secret_key=str(tmp_path / "k" / "server.key"),  # the public half by mistake
                curve_client_keys_dir=str(tmp_path / "k" / "authorized"),
            ),
            seed=0,
        )


def test_an_actors_public_key_file_must_match_its_secret(tmp_path: Path) -> None:
    """async_training.transport.curve_client_public_key is checked: a mismatched pair would only time out later."""
    from async_rl.transport.sockets import client_keys

    make_keys(tmp_path / "k", ["a", "b"])
    keys = tmp_path / "k"

    def transport(public: str) -> TransportConfig:
        return plane_config(
            curve_server_public_key=str(keys / "server.key"),
            curve_client_secret_key=str(keys / "clients" / "a.key_secret"),
            curve_client_public_key=public,
        ).async_training.transport

    loaded = client_keys(transport(str(keys / "authorized" / "a.key")))
    assert loaded is not None and loaded.public and loaded.secret
    with pytest.raises(ValueError, match="not the public half"):
        client_keys(transport(str(keys / "authorized" / "b.key")))
    with pytest.raises(ValueError, match="does not exist"):
        client_keys(transport(str(keys / "authorized" / "missing.key")))
