"""Reward-server entry point: serves the learned reward model (``reward.reward_model``) to every actor of a job.

::

    python -m async_rl.entrypoints.reward_server --config CONFIG reward.reward_model.port=5601 [key=value ...]

It binds ``async_training.transport.host`` at ``reward.reward_model.port`` (with the rollout plane's CURVE keys when
they are set; a non-loopback host needs them, as for the plane), loads the model at ``reward.reward_model.model_path``
and answers until SIGTERM or SIGINT. ``launchers/local.py`` starts it beside the actors and restarts it when it dies;
the actors ride out its absence (their requests time out and are tried again). It exits when its parent dies
(:mod:`async_rl.runtime.parent_watch`). ``--dry-run`` validates the config.

``--serving`` (first argument) prints what a launcher needs to know of the config and exits:
``<1 if a reward server is to run, else 0> <max_reward_server_restarts> <restart_backoff_s>``
(``launchers/actor_node.sh`` asks it).
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

from async_rl.config import parse_cli

logger = logging.getLogger("async_rl.reward_server")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--serving"]:
        return print_serving(args[1:])
    cfg, flags = parse_cli(args)
    if flags.dry_run:
        from async_rl.runtime.dry_run import print_dry_run

        return print_dry_run(cfg)
    if flags.print_config:
        return 0
    rm = cfg.reward.reward_model
    if not rm.enable:
        print("reward.reward_model.enable is false: there is no reward model to serve", file=sys.stderr)
        return 2
    from async_rl.runtime.parent_watch import watch_parent

    watch_parent(forked_children=False)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    import msgspec
    import zmq

    from async_rl.config.validate import check_reward_model_dir
    from async_rl.rewards.model_score import scorer_from_config
    from async_rl.rewards.server import RewardServer
    from async_rl.transport.sockets import bind_router, server_keys, start_authenticator, tcp_endpoint

    try:
        check_reward_model_dir(cfg)
    except ValueError as exc:
        print(f"reward server: {exc}", file=sys.stderr)
        return 2
    scorer = scorer_from_config(rm)
    transport = msgspec.structs.replace(cfg.async_training.transport, port=rm.port)
    ctx = zmq.Context()
    keys = server_keys(transport)
    auth = start_authenticator(ctx, keys) if keys is not None else None
    sock, port = bind_router(ctx, transport, keys)
    logger.info("reward server listening on %s (model %s)", tcp_endpoint(transport.host, port), rm.model_path)
    server = RewardServer(scorer, sock, max_batch=rm.max_batch_sequences, max_message_bytes=transport.max_message_bytes)
    try:
        stats = server.serve(lambda: bool(stopping))
    finally:
        sock.close(linger=0)
        if auth is not None:
            auth.stop()
        ctx.term()
    logger.info("reward server stopped: %s", stats.line())
    return 0


def print_serving(argv: list[str]) -> int:
    """Print ``<serve 0|1> <restarts> <backoff s>`` for the config ``argv`` describes (see the module doc)."""
    cfg, _ = parse_cli(argv)
    rm, launcher = cfg.reward.reward_model, cfg.async_training.launcher
    serve = int(rm.enable and rm.placement == "server")
    print(serve, launcher.max_reward_server_restarts, launcher.restart_backoff_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
