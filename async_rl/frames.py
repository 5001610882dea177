"""Length-prefixed msgpack frames between a parent and its child process (never pickle), and the child process itself.

A frame is a 4-byte little-endian length followed by that many bytes of msgpack. The reader takes a raw file
descriptor and an optional absolute ``time.monotonic()`` deadline, so the parent can bound how long it waits for a
child that hangs. The reward worker (:mod:`async_rl.rewards.worker`) and the environment worker
(:mod:`async_rl.envs.sandbox`) both speak it, and both start and kill their child with :func:`spawn_child` and
:func:`kill_child`: a session (and process group) of its own, so it is spared the signals meant for the parent, and
killed as a whole, with whatever user code in it started.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import sys
import time
from typing import IO, Any

import msgspec

HEADER = struct.Struct("<I")
MAX_FRAME = 64 * 1024 * 1024
"""Largest frame body accepted, in bytes; a larger length prefix means a corrupt stream."""


def encode_frame(payload: dict[str, Any]) -> bytes:
    """``payload`` as one frame; raises one of :data:`ENCODE_ERRORS`, before anything is written, for a value msgpack
    cannot carry or a frame past :data:`MAX_FRAME`."""
    body = msgspec.msgpack.encode(payload)
    if len(body) > MAX_FRAME:
        raise ValueError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


ENCODE_ERRORS = (TypeError, OverflowError, ValueError, msgspec.EncodeError)
"""What :func:`encode_frame` raises for a payload it cannot send."""


def write_frame(stream: IO[bytes], payload: dict[str, Any]) -> None:
    """Encode ``payload`` (see :func:`encode_frame`) and write it as one frame."""
    stream.write(encode_frame(payload))
    stream.flush()


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, n - len(chunks))
        if not chunk:
            raise EOFError("peer closed its pipe")
        chunks += chunk
    return bytes(chunks)


def read_frame(fd: int, deadline: float | None) -> Any:
    """Read one frame from ``fd``; ``TimeoutError`` past ``deadline``, ``EOFError`` when the peer closed the pipe."""
    (length,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    return msgspec.msgpack.decode(_read_exact(fd, length, deadline))


def spawn_child(module: str, *args: str) -> subprocess.Popen[bytes]:
    """``python -m module args`` with piped stdin and stdout (for frames), in a new session and process group."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )


def kill_child(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group (unless it already exited), reap it and close its pipes."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()
