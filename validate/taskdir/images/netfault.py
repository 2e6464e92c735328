"""A failed task build blamed on the machine, never on the task, when the harness can show it.

A build's ``RUN`` steps reach package indexes (pip, npm, apt, curl, git). When that fails
because of the machine — a TLS-intercepting proxy whose CA the build does not trust, a name
its resolver does not answer, a host its network does not reach — the task is not at fault.
The build log says what failed, but the log is the task's own output, so it only points at
a host; the verdict comes from the harness's own probe of that host from the build host
(the daemon is local: its builds share this machine's network), and a claim the probe does
not confirm leaves the failure the task's (``invalid_task_or_verifier``):

- TLS: the host's certificate verifies with the host's trust store but not with a public one
  (certifi's Mozilla bundle, what an image ships): this machine intercepts TLS →
  ``infrastructure_failure``, naming the host and the fix (``--build-trust-store host``);
- DNS: a well-known public index or code host (`PUBLIC_HOSTS`) does not resolve here (a
  name that is unknown everywhere would be the task's typo): a permanent "no such name" is
  this machine's egress policy → ``unsupported_execution_contract``; a temporary failure →
  ``infrastructure_failure``;
- connect: a host that resolves but refuses or times out from here → ``infrastructure_failure``;
- a build policy without network (``none``) whose build reached for one →
  ``unsupported_execution_contract``: the profile does not give builds a network.

Probes are cached per host for a few minutes, so a thousand failing builds probe once.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Literal

from validate.core.records import INFRASTRUCTURE_FAILURE, UNSUPPORTED_CONTRACT

#: Package indexes and code hosts every such build reaches; a failed name lookup of one is
#: the machine's, not a typo of the task's.
PUBLIC_HOSTS = frozenset({
    "pypi.org", "files.pythonhosted.org", "pypi.python.org", "bootstrap.pypa.io", "download.pytorch.org",
    "registry.npmjs.org", "registry.yarnpkg.com", "nodejs.org", "deb.debian.org", "security.debian.org",
    "archive.ubuntu.com", "security.ubuntu.com", "ports.ubuntu.com", "dl-cdn.alpinelinux.org", "github.com",
    "codeload.github.com", "objects.githubusercontent.com", "raw.githubusercontent.com", "ghcr.io",
    "registry-1.docker.io", "crates.io", "index.crates.io", "static.crates.io", "static.rust-lang.org",
    "sh.rustup.rs", "proxy.golang.org", "sum.golang.org", "go.dev", "dl.google.com", "repo1.maven.org",
    "repo.maven.apache.org", "rubygems.org", "conda.anaconda.org", "repo.anaconda.com", "huggingface.co",
    "cdn.jsdelivr.net", "gitlab.com", "bitbucket.org"})
_HOST = r"([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+)"
_TLS = re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|SSL certificate problem|"
                  r"SELF_SIGNED_CERT_IN_CHAIN|UNABLE_TO_GET_ISSUER_CERT|server certificate verification "
                  r"failed|cannot verify \S+ certificate|unable to get local issuer certificate",
                  re.IGNORECASE)
_DNS = re.compile(r"Temporary failure in name resolution|Name or service not known|Could not resolve host|"
                  r"Temporary failure resolving|Could not resolve '|getaddrinfo ENOTFOUND|getaddrinfo "
                  r"EAI_AGAIN|No address associated with hostname|nodename nor servname", re.IGNORECASE)
_CONNECT = re.compile(r"Connection refused|Connection timed out|Network is unreachable|Failed to connect to|"
                      r"ECONNREFUSED|ETIMEDOUT|ENETUNREACH|Read timed out", re.IGNORECASE)
_HOSTS = (re.compile(r"https?://" + _HOST), re.compile(r"host='" + _HOST + "'"),
          re.compile(r"(?:resolve host:?|resolving|resolve|ENOTFOUND|EAI_AGAIN|connect to) '?" + _HOST),
          re.compile(r"cannot verify " + _HOST + "'s certificate"))
_PROBE_TTL_S = 300.0
_PROBE_TIMEOUT_S = 5.0
_MAX_HOSTS = 3

Kind = Literal["tls", "dns", "connect"]


@dataclass(frozen=True)
class NetError:
    """A network failure the log reports: its kind and the host it names."""

    kind: Kind
    host: str


@dataclass(frozen=True)
class Probe:
    """What the build host itself sees of a host on port 443."""

    host: str
    resolves: bool
    permanent: bool  # the resolver said the name does not exist (not a temporary failure)
    connects: bool
    host_trust: bool  # its TLS certificate verifies with this machine's trust store
    public_trust: bool  # ... and with a public one (certifi's)


def network_errors(log: str) -> list[NetError]:
    """The network failures a build log reports, each with the host it names (at most a few)."""
    found: dict[tuple[str, str], NetError] = {}
    for line in log.splitlines():
        kind: Kind | None = "tls" if _TLS.search(line) else "dns" if _DNS.search(line) else \
            "connect" if _CONNECT.search(line) else None
        if kind is None:
            continue
        for pattern in _HOSTS:
            for m in pattern.finditer(line):
                host = m.group(1).lower().rstrip(".")
                found.setdefault((kind, host), NetError(kind, host))
    return list(found.values())[:_MAX_HOSTS]


_CACHE: dict[str, tuple[float, Probe]] = {}
_LOCK = threading.Lock()


def probe(host: str) -> Probe:
    """Resolve, connect to and verify `host`:443 from this machine (cached a few minutes)."""
    with _LOCK:
        hit = _CACHE.get(host)
        if hit is not None and time.monotonic() - hit[0] < _PROBE_TTL_S:
            return hit[1]
    try:
        socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
        resolves, permanent = True, False
    except socket.gaierror as e:
        resolves, permanent = False, e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5))
    connects = resolves and _verifies(host, None) is not None
    result = Probe(host, resolves, permanent, connects, connects and bool(_verifies(host, "host")),
                   connects and bool(_verifies(host, "public")))
    with _LOCK:
        _CACHE[host] = (time.monotonic(), result)
    return result


def _verifies(host: str, store: Literal["host", "public"] | None) -> bool | None:
    """None: no TCP connection; else whether the TLS handshake verified against `store` (None:
    connect only)."""
    try:
        sock = socket.create_connection((host, 443), timeout=_PROBE_TIMEOUT_S)
    except OSError:
        return None
    with sock:
        if store is None:
            return True
        try:
            with _context(store).wrap_socket(sock, server_hostname=host):
                return True
        except (ssl.SSLError, OSError):
            return False


def _context(store: Literal["host", "public"]) -> ssl.SSLContext:
    if store == "host":
        return ssl.create_default_context()
    import certifi  # a dependency of requests: the public (Mozilla) bundle images ship

    return ssl.create_default_context(cafile=certifi.where())


def classify(log: str, network: str, trusted: bool = False) -> tuple[str, str] | None:
    """(verdict reason, detail) when the build failed for the machine's reasons, as the
    harness's own probes confirm; None when nothing confirms it (the task's failure).
    `trusted`: the build was given the host's trust store, so a TLS failure is not the
    machine's interception (the host's store verifies what the probe reached)."""
    errors = network_errors(log)
    if not errors:
        return None
    if network == "none":
        hosts = ", ".join(sorted({e.host for e in errors}))
        return (UNSUPPORTED_CONTRACT, f"the build reaches for the network ({hosts}) and this profile builds "
                                      f"without one")
    for error in errors:
        found = probe(error.host)
        if error.kind == "tls" and not trusted and found.host_trust and not found.public_trust:
            return (INFRASTRUCTURE_FAILURE, f"the build could not verify TLS to {error.host}: this machine "
                                            f"intercepts TLS ({error.host}'s certificate verifies only with "
                                            "the host's trust store); freeze with --build-trust-store host")
        if error.kind == "dns" and not found.resolves and error.host in PUBLIC_HOSTS:
            if found.permanent:
                return (UNSUPPORTED_CONTRACT, f"{error.host} does not resolve from this build host (its "
                                              "resolver says no such name): this machine's network "
                                              "does not reach it")
            return (INFRASTRUCTURE_FAILURE, f"{error.host} did not resolve from this build host (a temporary "
                                            f"failure of its resolver)")
        if error.kind in ("connect", "dns") and found.resolves and not found.connects:
            return (INFRASTRUCTURE_FAILURE,
                    f"{error.host} resolves but cannot be reached from this build host")
    return None
