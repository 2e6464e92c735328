"""The attempt's deadline over one HTTP request, from the request's send to its last byte.

A read timeout bounds each read, not the request: a server that sends a byte (a header line,
a stream chunk) just inside it every time can hold a request for ever. `Watchdog` shuts the
request's socket down at the deadline instead, which ends any read blocked on it at once.

It learns the socket from the connection itself: `Adapter` makes `requests` use connection
classes that, once a request is sent (on a new or a pooled connection), hand their socket to
the watchdog the calling thread armed (a thread-local: urllib3 sends and reads on the
caller's thread). Connecting is bounded by the connect timeout, which the client caps by the
time left.

The lock makes firing and disarming exclusive: the client disarms before the connection can
go back to the pool, so a pooled connection is never shut under another request.
"""

from __future__ import annotations

import socket
import threading
import time

import requests
import urllib3

_armed = threading.local()


class Watchdog:
    """Armed for one request on the calling thread; shuts its socket at `deadline` (None: never)."""

    def __init__(self, deadline: float | None) -> None:
        self.fired, self.armed = False, deadline is not None
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        if deadline is not None:
            self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
            self.timer.daemon = True
            self.timer.start()

    def watch(self, sock: socket.socket | None) -> None:
        with self.lock:
            self.sock = sock
            if self.fired and self.armed:  # the deadline passed while connecting or sending
                _shut(sock)

    def _fire(self) -> None:
        with self.lock:
            if self.armed:
                self.fired = True
                _shut(self.sock)

    def disarm(self) -> None:
        with self.lock:
            self.armed = False
        if self.timer is not None:
            self.timer.cancel()

    def __enter__(self) -> Watchdog:
        _armed.dog = self
        return self

    def __exit__(self, *exc) -> None:
        _armed.dog = None
        self.disarm()


def _shut(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed: nothing left to wait on


class _Watched:
    def request(self, *args, **kwargs):
        super().request(*args, **kwargs)
        dog = getattr(_armed, "dog", None)
        if dog is not None:
            dog.watch(self.sock)


class _HTTPConnection(_Watched, urllib3.connection.HTTPConnection):
    pass


class _HTTPSConnection(_Watched, urllib3.connection.HTTPSConnection):
    pass


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class Adapter(requests.adapters.HTTPAdapter):
    """`requests`' adapter whose connections report their socket to the armed `Watchdog`."""

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy, **kwargs):
        manager = super().proxy_manager_for(proxy, **kwargs)
        # a SOCKS proxy keeps its own
        if manager.pool_classes_by_scheme.get("http") is urllib3.HTTPConnectionPool:
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager
