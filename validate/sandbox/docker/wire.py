"""What the docker backend says to the daemon and reads back: the container it creates for a
request, the daemon's log stream, an exec's output stream, and what to say when no daemon
answers. Functions only; the backend (`validate.sandbox.docker.backend`) decides."""

from __future__ import annotations

import os
import socket

from docker.types import LogConfig, Mount, Ulimit
from docker.utils.socket import frames_iter

from validate.sandbox.base import RunRequest, watchdog_argv

LABEL = "deshuffle-validate"


def unreachable(error: Exception) -> str:
    """What to say when the daemon does not answer: which socket was tried, and the fix."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock (the default; DOCKER_HOST is unset)"
    return (f"backend docker: no Docker daemon answers at {host} ({type(error).__name__}: {error}). Start "
            "one with `bash scripts/setup.sh` (as root), point DOCKER_HOST at a running daemon, or freeze "
            "the contract for bwrap (`validate freeze --backend bwrap ...`)")


def create_container(api, image: str, req: RunRequest, run_label: str, **host) -> str:
    """Create the container of `req` through the low-level API (the high-level
    `containers.create` adds an inspect per attempt) and return its id. `host` replaces
    arguments of its host config (a profile's: its OCI runtime, how it sets a limit)."""
    lim = req.limits
    fsize = lim.max_file_mb * 1024 * 1024
    mounts = [Mount(target=m.target, source=str(m.source), type="bind", read_only=m.read_only)
              for m in req.mounts]
    tmpfs = None
    if req.tmp is None:
        tmpfs = {"/tmp": f"size={lim.tmpfs_mb}m,nr_inodes={lim.storage_inodes},mode=1777"}
    else:
        mounts.append(Mount(target="/tmp", source=str(req.tmp), type="bind", read_only=False))
    host_config = api.create_host_config(**dict(
        network_mode="none",
        mem_limit=f"{lim.memory_mb}m",
        memswap_limit=f"{lim.memory_mb}m",
        nano_cpus=int(lim.cpus * 1e9),
        pids_limit=lim.pids,
        read_only=True,
        tmpfs=tmpfs,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        ulimits=[Ulimit(name="fsize", soft=fsize, hard=fsize)],
        log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
        mounts=mounts,
    ) | host)
    return api.create_container(
        image,
        command=watchdog_argv(req.argv, lim.timeout_s),
        name=f"dv-{req.name}",
        labels={LABEL: run_label},
        user=req.user,
        working_dir=req.workdir,
        environment=dict(req.env),
        # With the network disabled, runc gives the container a fresh namespace holding only
        # `lo`, and dockerd skips libnetwork: no sandbox, no `libnetwork-setkey` prestart hook.
        # That hook and libnetwork's lock serialise `network_mode=none` starts: 5 starts/s
        # at any concurrency, against 9/s at -c 4 with it disabled (docs/performance.md).
        network_disabled=True,
        host_config=host_config,
    )["Id"]


def logs(api, cid: str) -> tuple[bytes, bytes]:
    """stdout and stderr in one request. `APIClient.logs` inspects the container before
    each call (to learn whether it has a tty; ours never do) and merges the two streams,
    so it cost four calls per attempt where this costs one."""
    # the client's 60 s, as its own calls
    res = api.get(f"{api.base_url}/v{api.api_version}/containers/{cid}/logs",
                  params={"stdout": 1, "stderr": 1}, timeout=api.timeout)
    res.raise_for_status()
    return demux_log(res.content)


def demux_log(data: bytes) -> tuple[bytes, bytes]:
    """Split Docker's multiplexed log stream (no tty) into stdout and stderr: frames of an
    8-byte header (stream 1 or 2, three zero bytes, big-endian payload length), then the
    payload."""
    streams = {1: bytearray(), 2: bytearray()}
    at = 0
    while at + 8 <= len(data):
        kind, size = data[at], int.from_bytes(data[at + 4:at + 8], "big")
        if kind in streams:
            streams[kind] += data[at + 8:at + 8 + size]
        at += 8 + size
    return bytes(streams[1]), bytes(streams[2])


def stream_exec(sock, stdin: bytes, limit_s: float, keep: int) -> tuple[bytes, bytes, bool]:
    """Feed `stdin` to an exec's hijacked socket, then read the head of its stdout and stderr;
    also whether the stream ended within `limit_s`."""
    raw = getattr(sock, "_sock", sock)
    raw.settimeout(limit_s)
    kept = {1: bytearray(), 2: bytearray()}
    ended = True
    try:
        if stdin:
            raw.sendall(stdin)
            raw.shutdown(socket.SHUT_WR)
        for stream, data in frames_iter(sock, tty=False):
            if stream in kept and len(kept[stream]) < keep:
                kept[stream] += data[: keep - len(kept[stream])]
    except TimeoutError:
        # Held open past the command's time by something it started (a detached process):
        # the agent's doing, a timeout by the harness's clock (the caller says so).
        ended = False
    finally:
        sock.close()
    return bytes(kept[1]), bytes(kept[2]), ended
