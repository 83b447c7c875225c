"""Pure parts of the container backends: Docker's multiplexed stream framing, the
head+tail output keeper, how an exit under `timeout -s KILL` is classified, and
which owners of labelled containers are gone."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxes.docker_api import demux_frames
from sandboxes.docker_owner import owner_is_gone, owner_label
from sandboxes.output import STDERR, STDOUT, OutputCollector, exec_result, timeout_argv


def frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(payload)) + payload


async def chunked(data: bytes, cuts: list[int]) -> AsyncIterator[bytes]:
    last = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}):
        yield data[last:cut]
        last = cut
    yield data[last:]


@given(
    frames=st.lists(st.tuples(st.sampled_from([STDOUT, STDERR]), st.binary(max_size=50)), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
)
def test_demux_reassembles_frames_split_anywhere(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    wire = b"".join(frame(stream, payload) for stream, payload in frames)
    got: dict[int, bytearray] = {STDOUT: bytearray(), STDERR: bytearray()}
    asyncio.run(demux_frames(chunked(wire, cuts), lambda stream, data: got[stream].extend(data)))
    for stream in (STDOUT, STDERR):
        assert bytes(got[stream]) == b"".join(p for s, p in frames if s == stream)


def test_keeper_keeps_head_and_tail_of_each_stream_within_the_limit() -> None:
    output = OutputCollector(400)  # 100 bytes of head and 100 of tail per stream
    for index in range(100):
        output.add(STDOUT, f"line {index:03d}\n".encode())
    output.add(STDERR, b"short\n")
    kept = output.result()
    assert kept.stdout.startswith(b"line 000\n") and kept.stdout.endswith(b"line 099\n")
    assert b"bytes not kept" in kept.stdout and kept.stderr == b"short\n"
    assert kept.total_bytes == 900 + 6 and kept.truncated


def test_exit_classification() -> None:
    def classify(code: int, duration: float, stderr: bytes = b"") -> tuple[bool, str | None]:
        output = OutputCollector(1000)
        output.add(STDERR, stderr)
        result = exec_result(code, output, duration, 10.0)
        return result.timed_out, result.killed_reason

    assert classify(137, 10.2) == (True, "timeout")
    assert classify(137, 1.0) == (False, "memory")
    assert classify(152, 1.0) == (False, "cpu")
    assert classify(2, 0.1, b"sh: 1: Cannot fork\n") == (False, "processes")
    assert classify(1, 0.1, b"AssertionError\n") == (False, None)
    with pytest.raises(ValueError, match="positive"):
        timeout_argv("true", 0)


def test_only_owners_known_dead_on_this_host_are_gone() -> None:
    host = socket.gethostname()
    me = owner_label()
    assert not owner_is_gone(me)
    pid = me.split("/")[1]
    assert owner_is_gone(f"{host}/{pid}/1")  # same pid, other start time: a reused pid
    assert owner_is_gone(f"{host}/999999999/0")
    assert not owner_is_gone(f"another-host-{host}/999999999/0")
    assert not owner_is_gone("")
