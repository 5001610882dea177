"""Socket construction for the rollout plane: one ROUTER (coordinator) and DEALERs (actors), nothing else for data.

Policy enforced here:
  * Bind to loopback unless CURVE keys are configured; a non-loopback bind without them raises ValueError that says
    how to make keys. With CURVE, a ZAP authenticator admits only the public keys in the authorized directory, so an
    unknown key or a plaintext peer never delivers a message.
  * Every socket has bounded send/receive high-water marks (backpressure instead of unbounded queues); sends that hit
    the mark block or raise zmq.Again, never drop silently.
  * The ROUTER sets ROUTER_MANDATORY (unroutable sends raise EHOSTUNREACH instead of vanishing) and ROUTER_HANDOVER
    (a reconnecting actor with the same identity takes over its route).
  * MAXMSGSIZE is set on every receiving socket. zmq enforces it by silently disconnecting the offending peer, so
    senders must check sizes first (codec.WireCodec.encode_checked).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from async_rl.config.async_training import TransportConfig

logger = logging.getLogger(__name__)

ZAP_DOMAIN = "async_rl"
KEYS_HINT = "make keys with `python -m async_rl.transport.keys DIR` (see async_rl/transport/keys.py for the layout)"


def is_loopback(host: str) -> bool:
    """True for localhost names and loopback IPs; wildcards ('*', 0.0.0.0, ::) and interface names are not."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def tcp_endpoint(host: str, port: int | str) -> str:
    bare = host.strip("[]")
    if ":" in bare:  # IPv6 literal
        return f"tcp://[{bare}]:{port}"
    return f"tcp://{bare}:{port}"


@dataclass(frozen=True)
class CurveServerKeys:
    public: bytes
    secret: bytes
    authorized_dir: str


@dataclass(frozen=True)
class CurveClientKeys:
    public: bytes
    secret: bytes
    server_public: bytes


def _load_keypair(path: str, what: str) -> tuple[bytes, bytes]:
    if not os.path.isfile(path):
        raise ValueError(f"{what} {path!r} does not exist; {KEYS_HINT}")
    public, secret = zmq.auth.load_certificate(path)
    if secret is None:
        raise ValueError(f"{what} {path!r} holds no secret key (pass the .key_secret file); {KEYS_HINT}")
    return public, secret


_SECTION = "async_training.transport"


def curve_server_enabled(transport: TransportConfig) -> bool:
    return transport.curve_server_secret_key is not None or transport.curve_client_keys_dir is not None


def curve_client_enabled(transport: TransportConfig) -> bool:
    return transport.curve_server_public_key is not None or transport.curve_client_secret_key is not None


def server_keys(transport: TransportConfig) -> CurveServerKeys | None:
    """Validate the bind policy and load the coordinator's CURVE keys (None: plaintext on loopback)."""
    if not curve_server_enabled(transport):
        if not is_loopback(transport.host):
            raise ValueError(
                f"refusing to bind the rollout plane to non-loopback host {transport.host!r} without CURVE keys: "
                f"set {_SECTION}.curve_server_secret_key and curve_client_keys_dir; {KEYS_HINT}"
            )
        return None
    secret_file, auth_dir = transport.curve_server_secret_key, transport.curve_client_keys_dir
    if secret_file is None or auth_dir is None:
        raise ValueError(
            f"CURVE on the coordinator needs both {_SECTION}.curve_server_secret_key and curve_client_keys_dir; "
            + KEYS_HINT
        )
    public, secret = _load_keypair(secret_file, f"{_SECTION}.curve_server_secret_key")
    if not os.path.isdir(auth_dir) or not any(name.endswith(".key") for name in os.listdir(auth_dir)):
        raise ValueError(f"{_SECTION}.curve_client_keys_dir {auth_dir!r} has no client .key files; {KEYS_HINT}")
    return CurveServerKeys(public, secret, auth_dir)


def client_keys(transport: TransportConfig) -> CurveClientKeys | None:
    if not curve_client_enabled(transport):
        return None
    server_file, secret_file = transport.curve_server_public_key, transport.curve_client_secret_key
    if server_file is None or secret_file is None:
        raise ValueError(
            f"CURVE on an actor needs both {_SECTION}.curve_server_public_key and curve_client_secret_key; " + KEYS_HINT
        )
    public, secret = _load_keypair(secret_file, f"{_SECTION}.curve_client_secret_key")
    claimed = transport.curve_client_public_key
    if claimed is not None:
        if not os.path.isfile(claimed):
            raise ValueError(f"{_SECTION}.curve_client_public_key {claimed!r} does not exist; {KEYS_HINT}")
        if zmq.auth.load_certificate(claimed)[0] != public:
            raise ValueError(
                f"{_SECTION}.curve_client_public_key {claimed!r} is not the public half of curve_client_secret_key"
                f" {secret_file!r}: the coordinator would refuse this actor; {KEYS_HINT}"
            )
    if not os.path.isfile(server_file):
        raise ValueError(f"{_SECTION}.curve_server_public_key {server_file!r} does not exist; {KEYS_HINT}")
    server_public, _ = zmq.auth.load_certificate(server_file)
    return CurveClientKeys(public, secret, server_public)


def _common_options(sock: zmq.Socket, transport: TransportConfig) -> None:
    sock.setsockopt(zmq.SNDHWM, transport.socket_hwm)
    sock.setsockopt(zmq.RCVHWM, transport.socket_hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, transport.max_message_bytes)
    sock.setsockopt(zmq.LINGER, 200)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)


def start_authenticator(ctx: zmq.Context, keys: CurveServerKeys) -> ThreadAuthenticator:
    """A ZAP handler on ``ctx`` that accepts only the CURVE public keys found in ``keys.authorized_dir``."""
    auth = ThreadAuthenticator(ctx, log=logging.getLogger(__name__ + ".zap"))
    auth.start()
    auth.configure_curve(domain=ZAP_DOMAIN, location=keys.authorized_dir)
    return auth


def bind_router(ctx: zmq.Context, transport: TransportConfig, keys: CurveServerKeys | None) -> tuple[zmq.Socket, int]:
    """The coordinator's ROUTER, bound per policy; returns (socket, port). Start the authenticator BEFORE this."""
    sock = ctx.socket(zmq.ROUTER)
    try:
        _common_options(sock, transport)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if keys is not None:
            sock.curve_server = True
            sock.curve_publickey = keys.public
            sock.curve_secretkey = keys.secret
            sock.zap_domain = ZAP_DOMAIN.encode()
        host = transport.host.strip("[]")
        if ":" in host:
            sock.setsockopt(zmq.IPV6, 1)
        if transport.port == 0:
            port = sock.bind_to_random_port(tcp_endpoint(host, "").rstrip(":"))
        else:
            sock.bind(tcp_endpoint(host, transport.port))
            port = transport.port
    except Exception:
        sock.close(linger=0)
        raise
    logger.info("rollout plane bound on %s (curve=%s)", tcp_endpoint(host, port), keys is not None)
    return sock, port


def connect_dealer(
    ctx: zmq.Context, address: str, identity: str, transport: TransportConfig, keys: CurveClientKeys | None
) -> zmq.Socket:
    """An actor's DEALER with routing id ``identity``, connected to ``address`` (tcp://host:port)."""
    sock = ctx.socket(zmq.DEALER)
    try:
        _common_options(sock, transport)
        sock.setsockopt(zmq.ROUTING_ID, identity.encode("ascii"))
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        if keys is not None:
            sock.curve_publickey = keys.public
            sock.curve_secretkey = keys.secret
            sock.curve_serverkey = keys.server_public
        if address.startswith("tcp://[") or address.count(":") > 2:
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(address)
    except Exception:
        sock.close(linger=0)
        raise
    return sock
