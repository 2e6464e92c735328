"""The trial's network signal without a sidecar (`validate.taskdir.trial.nsresolver`), on real docker
(the suite's own dockerd): containers of the sandbox image with no network, the harness's
sockets bound in their namespaces, the resolver files mounted read-only.

What is shown: names asked by ``getent`` (UDP, and TCP with ``use-vc``) and by Python's
``getaddrinfo`` are recorded, answered NXDOMAIN over both; the container's hostname and
``localhost`` are not asked; names asked after `boundary` and in an attached verifier's
container are the verifier's; the per-phase cap counts what it does not name, and a
hostile name is recorded inert; root in the container cannot bind port 53 (any address,
any reuse option, UDP or TCP) nor write or unmount ``resolv.conf`` and ``hosts``; docker
replaces its own ``resolv.conf`` by the mount whether or not it manages the container's
network files; `close` leaves no thread or descriptor; a harness that may not enter the
namespace (not root), or a pid in its own namespace, gets `NamespaceError`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import docker
import pytest

from validate.core.paths import DEFAULT_IMAGE
from validate.sandbox.docker.wire import LABEL
from validate.taskdir.trial import dnslog, docker as dk, network, nsresolver

pytestmark = pytest.mark.docker

RUN_LABEL = f"pytest-nsresolver-{os.getpid()}"
HOSTNAME = "task"

#: Sends raw DNS questions from inside the container: `argv[1]` "udp"|"tcp", then names;
#: prints each answer's RCODE (3: NXDOMAIN) or the error.
ASK = textwrap.dedent("""\
    import socket, struct, sys
    via, names = sys.argv[1], sys.argv[2:]
    for n, name in enumerate(names):
        q = struct.pack("!HHHHHH", n, 0x0100, 1, 0, 0, 0)
        for label in name.encode("latin-1").split(b"."):
            q += bytes([len(label)]) + label
        q += b"\\0" + struct.pack("!HH", 1, 1)
        try:
            if via == "udp":
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
                s.sendto(q, ("127.0.0.1", 53)); reply = s.recv(4096)
            else:
                s = socket.create_connection(("127.0.0.1", 53), timeout=5)
                s.sendall(struct.pack("!H", len(q)) + q); reply = s.recv(4096)[2:]
            print(reply[3] & 0x0F)
        except OSError as e:
            print(type(e).__name__)
        s.close()
    """)
#: Root in the container tries to take the port: every combination, UDP and TCP.
TAKE_PORT = textwrap.dedent("""\
    import socket
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        for addr in ("127.0.0.1", "0.0.0.0"):
            for reuse in (0, 1):
                s = socket.socket(socket.AF_INET, kind)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, reuse)
                try:
                    s.bind((addr, 53))
                    print("bound", kind, addr, reuse)
                except OSError as e:
                    print(e.errno)
                s.close()
    """)


@pytest.fixture(scope="module")
def api():
    client = docker.from_env(timeout=120)
    yield client.api
    dk.sweep(client.api, f"{LABEL}={RUN_LABEL}")


@pytest.fixture
def start(api, tmp_path):
    """Start containers like the trial's (no network, a backstop sleep as PID 1) with the
    resolver files mounted; yields a starter returning (id, PID 1 on the host)."""
    made = []

    def starter(network_disabled: bool = True, with_files: bool = True,
                hosts_writable: bool = False) -> tuple[str, int]:
        mounts = nsresolver.mounts(tmp_path / f"files-{len(made)}", HOSTNAME,
                                   hosts_writable) if with_files else []
        host = api.create_host_config(network_mode="none", mounts=mounts, cap_drop=dk.CAP_DROP,
                                      security_opt=["no-new-privileges"])
        cid = api.create_container(DEFAULT_IMAGE, entrypoint=["sleep", "300"], command=[], hostname=HOSTNAME,
                                   labels={LABEL: RUN_LABEL}, network_disabled=network_disabled,
                                   host_config=host)["Id"]
        made.append(cid)
        api.start(cid)
        return cid, int(api.inspect_container(cid)["State"]["Pid"])

    yield starter
    for cid in made:
        api.remove_container(cid, force=True, v=True)


def run(api, cid: str, *cmd: str) -> tuple[int, str]:
    ex = api.exec_create(cid, list(cmd), user="0")
    out = api.exec_start(ex).decode("utf-8", "replace")
    return api.exec_inspect(ex)["ExitCode"], out


def test_names_are_recorded_by_phase_and_answered_nxdomain(api, start):
    cid, pid = start()
    with nsresolver.open(pid) as r:
        assert run(api, cid, "getent", "hosts", "example.org")[0] == 2  # not found
        code, out = run(api, cid, "sh", "-c", "RES_OPTIONS=use-vc getent hosts tcp.example.org; echo $?")
        assert out.split() == ["2"], out
        code, out = run(api, cid, "python3", "-c", "import socket\ntry:\n"
                                                   " socket.getaddrinfo('py.example.org', 443)\n"
                                                  "except socket.gaierror as e:\n"
                                                  " print(e.errno == socket.EAI_NONAME)")
        assert out.split() == ["True"], out
        assert run(api, cid, "python3", "-c", ASK, "udp", "raw-udp.example.org")[1].split() == ["3"]
        assert run(api, cid, "python3", "-c", ASK, "tcp", "raw-tcp.example.org")[1].split() == ["3"]
        # the container's own name and localhost are the files' (both address families), never DNS
        code, out = run(api, cid, "getent", "ahosts", HOSTNAME)
        assert code == 0 and "127.0.1.1" in out
        assert run(api, cid, "getent", "hosts", "localhost")[0] == 0
        r.boundary()
        run(api, cid, "getent", "hosts", "verifier.example.org")
        verifier_cid, verifier_pid = start()  # the verifier's container: a namespace of its own
        r.attach(verifier_pid)
        run(api, verifier_cid, "python3", "-c", ASK, "tcp", "fresh.example.org")
        found = r.lookups()
    assert found.agent == ["example.org", "py.example.org", "raw-tcp.example.org", "raw-udp.example.org",
                           "tcp.example.org"]
    assert found.verifier == ["fresh.example.org", "verifier.example.org"]
    assert (found.overflow, found.problem) == (0, None)
    assert network.offline_reason(found, is_reference=True, passed=False).startswith(
        "the verifier looked up fresh.example.org, verifier.example.org; the reference solution looked up ")


def test_what_a_dead_phase_left_queued_is_that_phases(api, start):
    """Questions sent without waiting for an answer (datagrams, and connections that sent
    their question and closed) by a process that has exited: `boundary` at once, and every
    one of them is the agent's."""
    cid, pid = start()
    burst = textwrap.dedent("""\
        import socket, struct
        def question(name):
            q = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0)
            for label in name.encode().split(b"."):
                q += bytes([len(label)]) + label
            return q + b"\\0" + struct.pack("!HH", 1, 1)
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for i in range(100):
            u.sendto(question("u%d.test" % i), ("127.0.0.1", 53))
        for i in range(10):
            t = socket.create_connection(("127.0.0.1", 53))
            q = question("t%d.test" % i)
            t.sendall(struct.pack("!H", len(q)) + q[:5]); t.sendall(q[5:]); t.close()
        """)
    with nsresolver.open(pid) as r:
        with r._lock:  # the loop held off: what the burst left is the boundary's to serve
            assert run(api, cid, "python3", "-c", burst)[0] == 0
        r.boundary()
        found = r.lookups()
    assert found.agent == sorted([f"u{i}.test" for i in range(100)] + [f"t{i}.test" for i in range(10)])
    assert found.verifier == [] and found.overflow == 0


def test_a_phase_names_at_most_its_cap_and_a_hostile_name_is_recorded_inert(api, start):
    cid, pid = start()
    many = [f"n{i}.test" for i in range(dnslog.MAX_NAMES + 4)]
    with nsresolver.open(pid) as r:
        out = run(api, cid, "python3", "-c", ASK, "udp", *many)[1].split()
        assert out == ["3"] * len(many)  # past the cap still answered
        r.boundary()
        run(api, cid, "python3", "-c", ASK, "udp", 'evil\n{"mark": 1}.example', "x" * 63 + ".test")
        found = r.lookups()
    assert len(found.agent) == dnslog.MAX_NAMES and found.overflow == 4
    assert found.verifier == ['evil\\010{"mark":\\0321}.example', "x" * 63 + ".test"]


def test_root_in_the_container_cannot_take_the_port_or_change_the_files(api, start):
    cid, pid = start()
    with nsresolver.open(pid) as r:
        code, out = run(api, cid, "python3", "-c", TAKE_PORT)
        assert out.split() == ["98"] * 8, out  # EADDRINUSE, every way
        for path in ("/etc/resolv.conf", "/etc/hosts"):
            code, out = run(api, cid, "sh", "-c", f"echo 'nameserver 10.1.2.3' > {path}")
            assert code != 0 and "Read-only file system" in out, out
            assert run(api, cid, "chmod", "000", path)[0] != 0
            assert run(api, cid, "umount", path)[0] != 0
        code, out = run(api, cid, "cat", "/etc/resolv.conf")
        assert out == nsresolver.RESOLV_CONF
        run(api, cid, "getent", "hosts", "still.example.org")
        assert r.lookups().agent == ["still.example.org"]


@pytest.mark.parametrize("network_disabled", [True, False], ids=["no-network-files", "docker-network-files"])
def test_docker_replaces_its_own_resolv_conf_by_the_mount(api, start, network_disabled):
    """With the network disabled docker mounts none of its files (the image's own would be
    read); with network none it writes its own: either way the mount at the path wins."""
    cid, _ = start(network_disabled=network_disabled)
    mounts = run(api, cid, "cat", "/proc/self/mounts")[1].splitlines()
    for path in ("/etc/resolv.conf", "/etc/hosts"):
        assert [m.split()[3].split(",")[0] for m in mounts if m.split()[1] == path] == ["ro"]
    assert run(api, cid, "cat", "/etc/resolv.conf")[1] == nsresolver.RESOLV_CONF
    bare, _ = start(network_disabled=network_disabled, with_files=False)
    # why the mount is needed
    assert "nameserver 127.0.0.1" not in run(api, bare, "cat", "/etc/resolv.conf")[1]


def test_a_writable_hosts_is_the_containers_own(api, start):
    """For tasks that add a name to /etc/hosts: they still can, resolv.conf stays read-only,
    and the next container's hosts is fresh."""
    cid, pid = start(hosts_writable=True)
    with nsresolver.open(pid) as r:
        assert run(api, cid, "sh", "-c", "echo '127.0.0.1 service.example.org' >> /etc/hosts")[0] == 0
        assert "service.example.org" in run(api, cid, "cat", "/etc/hosts")[1]
        assert run(api, cid, "sh", "-c", "echo 'nameserver 10.1.2.3' > /etc/resolv.conf")[0] != 0
        run(api, cid, "getent", "hosts", "other.example.org")
        assert r.lookups().agent == ["other.example.org"]
    fresh, _ = start(hosts_writable=True)
    assert "service.example.org" not in run(api, fresh, "cat", "/etc/hosts")[1]


def _fds() -> list[str]:
    found = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            found.append(f"{fd} {os.readlink(f'/proc/self/fd/{fd}')}")
        except FileNotFoundError:
            pass  # the listing's own descriptor
    return found


def test_close_leaves_no_thread_or_descriptor(start):
    cid, pid = start()
    verifier_cid, verifier_pid = start()

    def trial():
        # its connections closed below: only the resolver's remain to see
        api = docker.from_env(timeout=120).api
        try:
            r = nsresolver.open(pid)
            run(api, cid, "python3", "-c", ASK, "tcp", "a.example.org")
            run(api, cid, "sh", "-c",
                "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 53))'")
            r.boundary()
            r.attach(verifier_pid)
            run(api, verifier_cid, "getent", "hosts", "b.example.org")
            found = r.lookups()
            r.close()
            r.close()  # idempotent
            return found
        finally:
            api.close()

    trial()  # whatever the first use of a client opens once
    fds, threads = _fds(), sorted(t.name for t in threading.enumerate())
    found = trial()
    assert (found.agent, found.verifier) == (["a.example.org"], ["b.example.org"])
    assert [fd for fd in _fds() if fd not in fds] == []
    assert sorted(t.name for t in threading.enumerate()) == threads
    assert nsresolver.open(pid).close() is None  # the port is free again in the namespace


def test_a_harness_that_may_not_enter_gets_a_clear_error(api, start):
    _, pid = start()
    with pytest.raises(nsresolver.NamespaceError, match="own network namespace"):
        nsresolver.open(os.getpid())
    with pytest.raises(nsresolver.NamespaceError, match="not running"):
        nsresolver.open(2 ** 22 + 1)
    not_root = ("import os, sys\nfrom validate.taskdir.trial import nsresolver\n"
                "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
                "try:\n nsresolver.open(int(sys.argv[1]))\nexcept nsresolver.NamespaceError as e:\n print(e)")
    out = subprocess.run([sys.executable, "-c", not_root, str(pid)], capture_output=True, text=True,
                         timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert "not root" in out.stdout or "CAP_SYS_ADMIN" in out.stdout, (out.stdout, out.stderr)
    with nsresolver.open(pid) as r:  # and one that may
        with pytest.raises(nsresolver.NamespaceError, match="already there"):
            nsresolver.open(pid)  # the port is taken: by the first
        assert r.lookups().problem is None
