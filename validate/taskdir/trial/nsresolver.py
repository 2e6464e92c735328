"""The trial's network signal without a sidecar: the harness's own DNS responder, listening
on 127.0.0.1:53 *inside* a task container's network namespace.

`validate.taskdir.trial.network` gets the same signal from a resolver sidecar container whose
network namespace the task containers join; that costs one container start per trial. Here
the harness (root on the host) enters the namespace of a running container's PID 1 on a
short-lived helper thread (``setns(/proc/<pid>/ns/net, CLONE_NEWNET)`` through ctypes),
creates and binds a UDP and a TCP socket to 127.0.0.1:53 there, and goes back to the
thread's own namespace (`_sockets_in`). A socket stays in the namespace it was created in,
whoever holds it: from then on one thread of the harness per trial (`Resolver`, a selector
loop) answers every question NXDOMAIN and records the name, with the parsing and the
answer of `validate.taskdir.trial.dnslog` (the sidecar's responder, imported, not repeated) and its
per-phase cap (`dnslog.MAX_NAMES`; past it, questions are counted, not named).

The container's ``/etc/resolv.conf`` is a read-only bind mount of a file the harness wrote
(`mounts`: ``nameserver 127.0.0.1`` with ``options timeout:1 attempts:1``, so nothing waits
long for an answer), and so is its ``/etc/hosts`` (``localhost`` and, when the caller names
the container's hostname, that name: neither is looked up by DNS, so neither shows up as
a lookup). Docker 20.10 replaces its own file at a path the container has a mount for
(tests/test_trial_nsresolver.py shows it: with ``network_mode=none`` and no network,
docker mounts no resolv.conf or hosts at all, and the image's own, often empty, would be
read).

Why it is safe, for a container whose processes are hostile (root in the container,
docker's default capabilities, no ``CAP_SYS_ADMIN`` or ``CAP_NET_ADMIN``):

- the sockets belong to the harness's process: nothing in the container can signal, kill,
  ptrace or replace it (another PID namespace, and the container holds no descriptor of it);
- they are bound before the container's first exec (its PID 1 is the harness's backstop
  ``sleep``), neither with ``SO_REUSEPORT``, the UDP one without ``SO_REUSEADDR``, the TCP
  one listening (`_bind`): a process in the container that binds 127.0.0.1:53 or
  0.0.0.0:53 later, over UDP or TCP, with or without those options, gets ``EADDRINUSE``;
- ``/etc/resolv.conf`` is a read-only mount (``EROFS`` for root too; remounting needs
  ``CAP_SYS_ADMIN``), and so is ``/etc/hosts`` unless the caller asks for a writable copy
  of its own per container (`mounts`, ``hosts_writable``: a task that adds a name there
  still can, as it could in the sidecar's shared file); either way every container gets
  them fresh: nothing the agent did to its container's files reaches the verifier's;
- redirecting port 53 elsewhere (iptables, routes) needs ``CAP_NET_ADMIN``;
- the record is the harness's memory: a process in the container can only ask names, and a
  name is recorded as data (escaped by `dnslog.name_of`, cut at `MAX_NAME_CHARS`), never
  parsed as anything else.

Phases. `open` (the agent's container started, nothing run in it yet) → the agent's phase;
`Resolver.boundary` (every process of the agent's phase dead) serves every question
already queued (datagrams, connections, partial reads) into the agent's phase, then later
names count for the verifier's; `Resolver.attach` adds the verifier's container (a fresh
namespace) before its first exec. `Resolver.lookups` is a `validate.taskdir.trial.network.Lookups`,
so `network.offline_reason` and `network.describe` are the rule and the evidence as before.
`Resolver.close` always (idempotent): the loop ends and every descriptor is closed.

In a trial: each phase's container is created with `mounts` (and the ``hostname`` given
to them); the agent's is started, ``r = open(pid)`` before its first exec (on
`NamespaceError`, the sidecar); once it is killed ``r.boundary()``; the verifier's
container started, ``r.attach(pid)`` before ``test.sh``; at the end, whatever happened,
``lookups = r.lookups()`` and ``r.close()``. One thread per trial: a trial's loop never
waits on another's, and `close` leaves nothing behind.

This needs the container's loopback to be the kernel's, in the namespace docker made for
it (runc, as the trial's containers run): a runtime with a network stack of its own
(gVisor's) would never deliver a question to these sockets, and the trial's names would go
unanswered and unrecorded.

Where ``setns`` is not permitted (the harness is not root, or not in the container's user
namespace's ancestry), `open` raises `NamespaceError` saying so, and the caller can use the
sidecar instead. The pid is read from docker after the start; should that container die
and its pid be reused before `open`, the namespace would be another process's: `open`
refuses the harness's own namespace outright, and the caller checks the container still
runs after `open` returns.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from docker.types import Mount

from validate.core.errors import DaemonError
from validate.taskdir.trial import dnslog
from validate.taskdir.trial.network import Lookups

CLONE_NEWNET = 0x40000000
ADDRESS = ("127.0.0.1", 53)
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
#: A name is recorded at most this long (as `network.lookups` cuts the sidecar's).
MAX_NAME_CHARS = 300
#: TCP connections served at once per resolver (more are closed unanswered and counted).
MAX_CONNECTIONS = 16
#: A TCP question not whole after this long is dropped (as the sidecar's `dnslog.TCP_READ_S`).
TCP_READ_S = dnslog.TCP_READ_S
BACKLOG = 64
#: Datagrams or connections the loop takes from one socket before looking at the others.
MOST_AT_ONCE = 64
_HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}")
_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceError(DaemonError):
    """The harness could not listen in the container's network namespace (why, in words)."""


def mounts(directory: Path, hostname: str | None = None, hosts_writable: bool = False) -> list[Mount]:
    """Write the container's ``resolv.conf`` and ``hosts`` into `directory` (the harness's
    own, kept until the container is removed) and return their bind mounts at ``/etc``,
    read-only. `hostname`: the name the caller gives the container (``hostname=`` at its
    creation), resolved in ``hosts`` so that looking it up asks no DNS. `hosts_writable`:
    ``hosts`` mounted writable, `directory` then being this container's alone."""
    if hostname is not None and not _HOSTNAME.fullmatch(hostname):
        raise ValueError(f"not a hostname: {hostname!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # both families: ``getent hosts`` asks for an IPv6 address first, and that must not reach DNS either
    hosts = dnslog.HOSTS + (f"127.0.1.1\t{hostname}\n::1\t{hostname}\n" if hostname else "")
    found = []
    for name, text in (("resolv.conf", RESOLV_CONF), ("hosts", hosts)):
        path = directory / name
        path.write_text(text)
        path.chmod(0o644)
        found.append(Mount(target=f"/etc/{name}", source=str(path), type="bind",
                           read_only=name != "hosts" or not hosts_writable))
    return found


def open(pid: int) -> Resolver:  # noqa: A001 - the module's verb: nsresolver.open(pid)
    """Listen on 127.0.0.1:53 in the network namespace of `pid` (a running container's PID 1,
    before anything else runs in it); the agent's phase starts. `NamespaceError` if the
    harness may not (see the module docstring)."""
    return Resolver(_sockets_in(pid))


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NamespaceError(f"setns into {what} failed: {os.strerror(err)} (entering another network "
                             "namespace needs CAP_SYS_ADMIN: run the harness as root, or use the "
                             "resolver sidecar)")


def _sockets_in(pid: int) -> list[socket.socket]:
    """A UDP and a listening TCP socket bound to `ADDRESS` in `pid`'s network namespace,
    made on a helper thread that enters it and comes back (`setns` changes only the calling
    thread; were the way back refused, that thread ends there and nothing else of the
    process ever ran in the container's namespace)."""
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["socks"] = _enter_and_bind(pid)
        except BaseException as e:  # carried to the caller's thread
            box["error"] = e

    helper = threading.Thread(target=work, name=f"nsresolver-setns-{pid}", daemon=True)
    helper.start()
    helper.join()
    if "error" in box:
        error = cast(BaseException, box["error"])  # work() stores only what it caught there
        if isinstance(error, NamespaceError):
            raise error
        raise NamespaceError(f"listening in the network namespace of pid {pid} failed: "
                             f"{type(error).__name__}: {error}") from error
    return box["socks"]  # type: ignore[return-value]


def _enter_and_bind(pid: int) -> list[socket.socket]:
    flags = os.O_RDONLY | os.O_CLOEXEC
    own = os.open("/proc/thread-self/ns/net", flags)
    try:
        try:
            target = os.open(f"/proc/{int(pid)}/ns/net", flags)
        except FileNotFoundError:
            raise NamespaceError(f"no process {pid}: the container is not running") from None
        except PermissionError:
            raise NamespaceError(f"the network namespace of pid {pid} may not be opened (not root: "
                                 f"use the resolver sidecar)") from None
        try:
            here, there = os.fstat(own), os.fstat(target)
            if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                raise NamespaceError(f"pid {pid} shares the harness's own network namespace: it is not a "
                                     f"container with a network namespace of its own")
            _setns(target, f"the network namespace of pid {pid}")
            socks: list[socket.socket] = []
            try:
                socks = _bind()
            finally:
                try:
                    _setns(own, "the harness's own network namespace")
                except NamespaceError:
                    for s in socks:
                        s.close()
                    raise
            return socks
        finally:
            os.close(target)
    finally:
        os.close(own)


def _bind() -> list[socket.socket]:
    """Nothing else may bind the port while these live: no SO_REUSEPORT on either, no
    SO_REUSEADDR on the UDP socket (two UDP sockets that both set it share a port). The TCP
    one sets SO_REUSEADDR, so the namespace can be listened in again while connections this
    one answered and closed wait out TIME_WAIT; that does not share a port held by a
    listening socket, with or without the option on the other side."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for s in (udp, tcp):
            s.setblocking(False)
            try:
                s.bind(ADDRESS)
            except OSError as e:
                raise NamespaceError(
                    f"binding {ADDRESS[0]}:{ADDRESS[1]} in the container's namespace "
                    f"failed: {e.strerror} (is its loopback up? is something already there?)"
                ) from None
        tcp.listen(BACKLOG)
    except BaseException:
        udp.close()
        tcp.close()
        raise
    return [udp, tcp]


@dataclass
class _Phase:
    names: set[str] = field(default_factory=set)
    dropped: int = 0


@dataclass
class _Connection:
    deadline: float
    data: bytearray = field(default_factory=bytearray)


class Resolver:
    """The trial's responder: its sockets (one UDP and one TCP per namespace), its loop
    thread, and what each phase asked. Everything runs under one lock, so a `boundary` or a
    `lookups` from the caller's thread sees the loop between two questions."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._selector.register(self._wake, selectors.EVENT_READ)
        self._listeners: list[socket.socket] = []
        self._connections: dict[socket.socket, _Connection] = {}
        self._phases = [_Phase(), _Phase()]
        self._phase = 0
        self._stopping = self._closed = False
        self.problem: str | None = None
        self._add(socks)
        self._thread = threading.Thread(target=self._loop, name="nsresolver", daemon=True)
        self._thread.start()

    def __enter__(self) -> Resolver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the caller's side --------------------------------------------------------------------

    def attach(self, pid: int) -> None:
        """Listen in `pid`'s namespace too (the verifier's container, before its first exec);
        its names count for the phase they are asked in."""
        socks = _sockets_in(pid)
        with self._lock:
            if self._stopping:
                for s in socks:
                    s.close()
                raise NamespaceError("the resolver is closed")
            self._add(socks)
            os.eventfd_write(self._wake, 1)

    def boundary(self) -> None:
        """End the agent's phase (its processes are dead): every question already queued is
        served as the agent's; later ones are the verifier's."""
        with self._lock:
            if not self._stopping:
                self._drain()
                os.eventfd_write(self._wake, 1)  # the loop's next deadline may have changed
            self._phase = 1

    def lookups(self) -> Lookups:
        """What each phase asked (what is queued now served first)."""
        with self._lock:
            if not self._stopping:
                self._drain()
            agent, verifier = self._phases
            return Lookups(agent=sorted(agent.names), verifier=sorted(verifier.names),
                           overflow=agent.dropped + verifier.dropped, problem=self.problem)

    def close(self) -> None:
        """End the loop and close every socket (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._stopping = True
        os.eventfd_write(self._wake, 1)
        if self._thread is not threading.current_thread():
            self._thread.join()
        for s in [*self._connections, *self._listeners]:
            s.close()
        self._connections.clear()
        self._listeners.clear()
        self._selector.close()
        os.close(self._wake)

    # --- the loop -------------------------------------------------------------------------------

    def _add(self, socks: list[socket.socket]) -> None:
        for s in socks:
            self._listeners.append(s)
            self._selector.register(s, selectors.EVENT_READ)

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    timeout = self._expire()
                events = self._selector.select(timeout)
                with self._lock:
                    if self._stopping:
                        return
                    for key, _ in events:
                        if key.fileobj == self._wake:
                            try:
                                os.eventfd_read(self._wake)
                            except BlockingIOError:
                                pass
                        else:  # the rest registered are the listening sockets
                            self._serve(cast(socket.socket, key.fileobj), MOST_AT_ONCE)
        except Exception as e:  # recorded: lookups() says the record may be short
            with self._lock:
                self.problem = f"the harness's resolver stopped: {type(e).__name__}: {str(e)[:200]}"

    def _expire(self) -> float | None:
        """Close connections past their deadline; seconds until the next one (None: none)."""
        now = time.monotonic()
        for conn, state in sorted(self._connections.items(), key=lambda kv: kv[1].deadline):
            if state.deadline <= now:
                self._drop(conn)
        return min((s.deadline - now for s in self._connections.values()), default=None)

    def _serve(self, sock: socket.socket, most: int | None = None) -> None:
        """What `sock` has now (at most `most` datagrams or connections: the loop comes back
        to a busy socket after the others; a drain takes everything)."""
        if sock in self._connections:
            self._read(sock)
        elif sock in self._listeners:
            if sock.type == socket.SOCK_DGRAM:
                self._datagrams(sock, most)
            else:
                self._accept(sock, most)

    def _drain(self) -> None:
        """Serve everything queued now: datagrams, connections waiting, what open ones sent."""
        for sock in list(self._listeners):
            self._serve(sock)
        for conn in list(self._connections):
            self._read(conn)

    def _datagrams(self, udp: socket.socket, most: int | None) -> None:
        for _ in itertools.repeat(None) if most is None else range(most):
            try:
                msg, peer = udp.recvfrom(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue
            reply = self._question(msg)
            if reply:
                try:
                    udp.sendto(reply, peer)
                except OSError:
                    pass  # the asker's loss

    def _accept(self, tcp: socket.socket, most: int | None) -> None:
        for _ in itertools.repeat(None) if most is None else range(most):
            try:
                conn, _ = tcp.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue
            if len(self._connections) >= MAX_CONNECTIONS:
                self._phases[self._phase].dropped += 1
                conn.close()
                continue
            conn.setblocking(False)
            self._connections[conn] = _Connection(deadline=time.monotonic() + TCP_READ_S)
            self._selector.register(conn, selectors.EVENT_READ)
            self._read(conn)

    def _read(self, conn: socket.socket) -> None:
        """One question per connection (as the sidecar's): length, message, answer, close."""
        state = self._connections[conn]
        while True:
            try:
                chunk = conn.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return self._drop(conn)
            if not chunk:
                return self._drop(conn)
            state.data += chunk
            if len(state.data) >= 2 and len(state.data) >= 2 + struct.unpack("!H", state.data[:2])[0]:
                reply = self._question(bytes(state.data[2:2 + struct.unpack("!H", state.data[:2])[0]]))
                if reply:
                    try:
                        conn.send(struct.pack("!H", len(reply)) + reply)
                    except OSError:
                        pass
                return self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        del self._connections[conn]
        conn.close()

    def _question(self, msg: bytes) -> bytes | None:
        """Record the question's name in the current phase; the NXDOMAIN answer."""
        try:
            got = dnslog.name_of(msg)
            reply = dnslog.answer(msg)
        except (ValueError, IndexError, struct.error):
            return None
        if got is not None:
            phase, name = self._phases[self._phase], got[0][:MAX_NAME_CHARS]
            if name not in phase.names:
                if len(phase.names) >= dnslog.MAX_NAMES:
                    phase.dropped += 1
                else:
                    phase.names.add(name)
        return reply
