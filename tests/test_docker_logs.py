"""Docker's multiplexed log stream, split by hand: frames of both streams, in any order.
(The real daemon's logs go through it in every docker test of tests/test_sandbox.py.)"""

from __future__ import annotations

from validate.sandbox.docker import demux_log


def frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def test_frames_go_to_their_stream_in_order():
    data = frame(1, b"out-1 ") + frame(2, b"err-1 ") + frame(1, b"out-2") + frame(2, b"") + frame(2, b"err-2")
    assert demux_log(data) == (b"out-1 out-2", b"err-1 err-2")


def test_a_large_frame_and_a_stdin_frame():
    big = bytes(range(256)) * 4096  # 1 MiB, every byte value
    assert demux_log(frame(0, b"stdin is not output") + frame(2, big)) == (b"", big)


def test_nothing_and_a_cut_header():
    assert demux_log(b"") == (b"", b"")
    assert demux_log(frame(1, b"ok") + b"\x01\x00\x00") == (b"ok", b"")
