"""The reward server and its client over real ZeroMQ sockets on loopback: batching, refusals, deadlines, retries, and
a reward-server process that is stopped (SIGSTOP) or killed and restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
from _reward_model_fixture import VOCAB, export_reward_model

from async_rl.config import load_config
from async_rl.rewards.model_client import RewardModelClient, RewardModelUnavailable
from async_rl.rewards.model_score import RewardModelScorer, UntrustedScore
from async_rl.rewards.model_wire import ScoreReply, ScoreRequest, decode, encode
from async_rl.rewards.server import RewardServer
from async_rl.transport.sockets import bind_router

REPO = Path(__file__).resolve().parents[2]
TRANSPORT = load_config(None, []).async_training.transport


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_reward_model(tmp_path_factory.mktemp("rm"))


@pytest.fixture(scope="module")
def scorer(rm_dir: Path) -> RewardModelScorer:
    return RewardModelScorer(rm_dir, max_batch=64, max_length=64, normalize=True, dtype="float32", cpu_threads=None)


class _Counting:
    """The scorer, recording the size of each group it scored."""

    def __init__(self, inner: RewardModelScorer) -> None:
        self.inner = inner
        self.calls: list[list[int]] = []  # the group sizes of each scoring call

    def score_groups(self, items):  # type: ignore[no-untyped-def]
        out = self.inner.score_groups(items)
        self.calls.append([len(responses) for _, responses in items])
        return out


def _serve(scorer: object, port: int = 0) -> Iterator[tuple[RewardServer, int]]:
    ctx = zmq.Context()
    sock, bound = bind_router(ctx, msgspec.structs.replace(TRANSPORT, port=port), None)
    server = RewardServer(scorer, sock, max_batch=64, max_message_bytes=TRANSPORT.max_message_bytes)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop.is_set,), kwargs={"poll_ms": 10}, daemon=True)
    thread.start()
    try:
        yield server, bound
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close(linger=0)
        ctx.term()


@pytest.fixture()
def served(scorer: RewardModelScorer) -> Iterator[tuple[RewardServer, int, _Counting]]:
    counting = _Counting(scorer)
    for server, port in _serve(counting):
        yield server, port, counting


def _client(port: int, timeout_s: float = 5.0, retries: int = 0) -> RewardModelClient:
    return RewardModelClient(
        f"tcp://127.0.0.1:{port}", TRANSPORT, timeout_s=timeout_s, retries=retries, max_batch_sequences=64
    )


def test_the_server_answers_each_group_with_the_models_scores(
    served: tuple[RewardServer, int, _Counting], scorer: RewardModelScorer
) -> None:
    server, port, _ = served
    client = _client(port)
    try:
        got = client.score([5, 6], [[7, 8], [9], [10, 11, 12]])
    finally:
        client.close()
    assert got == pytest.approx(scorer.scores([[5, 6, 7, 8], [5, 6, 9], [5, 6, 10, 11, 12]]), abs=1e-6)
    assert (client.stats.requests, client.stats.sequences, client.stats.timeouts) == (1, 3, 0)
    assert (server.stats.requests, server.stats.sequences) == (1, 3)


def test_requests_waiting_together_are_answered_in_one_turn_and_a_bad_one_is_refused_alone(
    scorer: RewardModelScorer,
) -> None:
    counting = _Counting(scorer)
    ctx = zmq.Context()
    sock, port = bind_router(ctx, TRANSPORT, None)
    dealers = [ctx.socket(zmq.DEALER) for _ in range(3)]
    try:
        for i, d in enumerate(dealers):
            d.connect(f"tcp://127.0.0.1:{port}")
            ids = [[7, 8], [9]] if i != 1 else [[VOCAB + 5]]  # the second actor sends an id outside the vocabulary
            d.send(encode(ScoreRequest(request_id=f"r{i}", prompt_ids=[5, 6], response_ids=ids)))
        server = RewardServer(counting, sock, max_batch=64, max_message_bytes=TRANSPORT.max_message_bytes)
        deadline = time.monotonic() + 5
        batch: list[tuple[bytes, ScoreRequest]] = []
        while len(batch) < 3 and time.monotonic() < deadline:
            sock.poll(100)
            batch += server._receive()
        server.handle(batch)
        replies = []
        for d in dealers:
            assert d.poll(5000)
            replies.append(decode(d.recv(), TRANSPORT.max_message_bytes))
    finally:
        for d in dealers:
            d.close(linger=0)
        sock.close(linger=0)
        ctx.term()
    # one scoring call for the turn's three requests (in arrival order), the bad one refused alone
    assert len(counting.calls) == 1 and sorted(counting.calls[0]) == [1, 2, 2]
    assert [r.request_id for r in replies] == ["r0", "r1", "r2"]
    assert isinstance(replies[1], ScoreReply) and replies[1].error is not None
    assert f"[0, {VOCAB}), got 5..{VOCAB + 5}" in replies[1].error and replies[1].scores == []
    assert replies[0].scores == replies[2].scores and len(replies[0].scores) == 2
    assert (server.stats.requests, server.stats.refused, server.stats.turns) == (2, 1, 1)


def test_a_malformed_frame_is_dropped_and_the_server_goes_on(served: tuple[RewardServer, int, _Counting]) -> None:
    server, port, _ = served
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.DEALER)
    rogue.connect(f"tcp://127.0.0.1:{port}")
    rogue.send(b"\x93not msgpack of a request")
    # Until the server has read it: closed with linger 0 beside a busy core (two pytest workers), the frame was dropped
    # unsent before it was read (2026-12-06).
    deadline = time.monotonic() + 10
    while server.stats.malformed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    client = _client(port)
    try:
        assert len(client.score([5], [[6]])) == 1
    finally:
        client.close()
        rogue.close(linger=0)
        ctx.term()
    assert server.stats.malformed == 1 and server.stats.requests == 1


def _rogue_server(answer: object) -> Iterator[int]:
    """A ROUTER on loopback that answers every request with ``answer(request)`` (bytes), or never when it is None."""
    ctx = zmq.Context()
    sock, port = bind_router(ctx, TRANSPORT, None)
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            if sock.poll(10):
                identity, payload = sock.recv_multipart()
                request = decode(payload, TRANSPORT.max_message_bytes)
                assert isinstance(request, ScoreRequest)
                reply = answer(request) if callable(answer) else None
                if reply is not None:
                    sock.send_multipart([identity, reply])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close(linger=0)
        ctx.term()


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (lambda r: encode(ScoreReply(request_id="someone-else", scores=[1.0])), "answered request 'someone-else'"),
        (lambda r: encode(ScoreReply(request_id=r.request_id, scores=[float("nan")])), "non-finite"),
        (lambda r: encode(ScoreReply(request_id=r.request_id, scores=[1.0, 2.0])), "2 scores for 1"),
        (lambda r: encode(ScoreReply(request_id=r.request_id, error="out of memory")), "out of memory"),
        (lambda r: b"\x01garbage", "malformed"),
    ],
)
def test_an_answer_that_cannot_be_trusted_is_refused_not_retried(answer: object, match: str) -> None:
    for port in _rogue_server(answer):
        client = _client(port, timeout_s=5.0, retries=3)
        try:
            with pytest.raises(UntrustedScore, match=match):
                client.score([5], [[6]])
        finally:
            client.close()
        assert (client.stats.untrusted, client.stats.timeouts, client.stats.requests) == (1, 0, 0)


def test_a_silent_server_costs_each_attempt_its_deadline_then_the_client_gives_up() -> None:
    for port in _rogue_server(None):
        client = _client(port, timeout_s=0.3, retries=2)
        started = time.monotonic()
        try:
            with pytest.raises(RewardModelUnavailable, match="3 attempts of 0.3 s"):
                client.score([5], [[6]])
        finally:
            client.close()
        elapsed = time.monotonic() - started
        assert 0.9 <= elapsed < 3.0  # three deadlines, not an endless wait
        assert (client.stats.timeouts, client.stats.unavailable) == (3, 1)


# ---------------------------------------------------------------------------------------------------------------------
# The reward-server process (python -m async_rl.entrypoints.reward_server), stopped and killed


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(rm_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "async_rl.entrypoints.reward_server", "reward.reward_model.enable=true"]
    cmd += [f"reward.reward_model.model_path={rm_dir}", f"reward.reward_model.port={port}"]
    cmd += ["reward.reward_model.dtype=float32"]  # the scores are compared with the float32 scorer's
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _score_when_up(client: RewardModelClient, deadline_s: float = 60.0) -> list[float]:
    """Score once the server answers (it is starting: its import and model load take a few seconds)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return client.score([5, 6], [[7, 8], [9]])
        except RewardModelUnavailable:
            if time.monotonic() > end:
                raise


def test_a_stopped_server_delays_scoring_and_a_killed_one_is_replaced(
    rm_dir: Path, scorer: RewardModelScorer, tmp_path: Path
) -> None:
    port, log = _free_port(), tmp_path / "reward-server.log"
    expected = scorer.scores([[5, 6, 7, 8], [5, 6, 9]])
    server = _start_server(rm_dir, port, log)
    client = _client(port, timeout_s=1.0, retries=0)
    try:
        assert _score_when_up(client) == pytest.approx(expected, abs=1e-6)
        # SIGSTOP: every request misses its deadline (bounded), nothing is answered with a guess
        os.kill(server.pid, signal.SIGSTOP)
        started = time.monotonic()
        for _ in range(2):
            with pytest.raises(RewardModelUnavailable):
                client.score([5, 6], [[7, 8], [9]])
        assert time.monotonic() - started < 5.0
        os.kill(server.pid, signal.SIGCONT)
        assert _score_when_up(client, 10.0) == pytest.approx(expected, abs=1e-6)
        # SIGKILL, then a new server on the same port (what the launcher does): the client reconnects by itself
        server.kill()
        server.wait(timeout=10)
        with pytest.raises(RewardModelUnavailable):
            client.score([5, 6], [[7, 8], [9]])
        server = _start_server(rm_dir, port, log)
        assert _score_when_up(client) == pytest.approx(expected, abs=1e-6)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0
    finally:
        client.close()
        if server.poll() is None:
            server.kill()
    text = log.read_text()
    assert text.count("reward server listening on tcp://127.0.0.1:") == 2
    assert "reward server stopped:" in text
    assert client.stats.timeouts >= 3 and client.stats.untrusted == 0


def test_actors_dial_the_server_host_when_set_else_the_coordinators(tmp_path: Path) -> None:
    from async_rl.config import parse_cli
    from async_rl.runtime.actor_main import reward_model

    rm = export_reward_model(tmp_path / "rm")
    on = ["reward.reward_model.enable=true", f"reward.reward_model.model_path={rm}", "reward.reward_model.port=5601"]
    cfg, _ = parse_cli(on)
    client = reward_model(cfg, "tcp://10.0.0.5:29410")
    assert client.address == "tcp://10.0.0.5:5601"
    client.close()
    cfg, _ = parse_cli([*on, "reward.reward_model.server_host=127.0.0.1"])
    client = reward_model(cfg, "tcp://10.0.0.5:29410")
    assert client.address == "tcp://127.0.0.1:5601"
    client.close()


def test_several_groups_in_one_call_each_get_their_own_answer() -> None:
    """Groups whose prompt starts with an odd id are answered; the server never answers the even one."""

    def answer(r: ScoreRequest) -> bytes | None:
        if r.prompt_ids[0] % 2 == 0:
            return None
        return encode(ScoreReply(request_id=r.request_id, scores=[float(r.prompt_ids[0])] * len(r.response_ids)))

    for port in _rogue_server(answer):
        client = _client(port, timeout_s=0.3, retries=1)
        try:
            results = client.score_groups([([1], [[6]]), ([2], [[7]]), ([3], [[8], [9]])])
        finally:
            client.close()
        assert results[0] == [1.0] and results[2] == [3.0, 3.0]
        assert isinstance(results[1], RewardModelUnavailable)
        assert (client.stats.requests, client.stats.sequences, client.stats.timeouts, client.stats.unavailable) == (
            2,
            3,
            2,
            1,
        )


def test_a_reply_to_a_request_not_in_flight_refuses_every_group_still_waiting() -> None:
    def answer(r: ScoreRequest) -> bytes:
        rid = r.request_id if r.prompt_ids[0] == 1 else "someone-else"
        return encode(ScoreReply(request_id=rid, scores=[1.0] * len(r.response_ids)))

    for port in _rogue_server(answer):
        client = _client(port, timeout_s=5.0, retries=3)
        try:
            results = client.score_groups([([1], [[6]]), ([2], [[7]]), ([3], [[8]])])
        finally:
            client.close()
        assert results[0] == [1.0]
        assert all(isinstance(r, UntrustedScore) and "not in flight" in str(r) for r in results[1:])
        assert (client.stats.requests, client.stats.untrusted, client.stats.timeouts) == (1, 2, 0)
