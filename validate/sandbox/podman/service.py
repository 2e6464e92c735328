"""What the podman backend says to the rootless service besides the Docker API: where it is,
the container's uid and gid maps (`idmap`), and the syscall filter (`seccomp_profile`)."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
from pathlib import Path

from validate.core.errors import ProfileUnavailable

#: The socket of the rootless service; unset, the default user's at its XDG runtime dir.
HOST_ENV = "VALIDATE_PODMAN_HOST"
#: The unprivileged user set-up creates to run the service.
USER = "dv-podman"
#: The podman (libpod) API version of the one endpoint the Docker API lacks.
LIBPOD = "v4.0.0"

#: podman's default syscall filter, which this profile tightens (`seccomp_profile`).
PODMAN_SECCOMP = Path("/usr/share/containers/seccomp.json")
#: Allowed unconditionally by podman's default (it relies on capabilities, and rootless
#: containers hold some in their own user namespace): refused here, as docker's default does.
REFUSED = frozenset({"unshare", "setns", "mount", "umount", "umount2", "pivot_root", "keyctl", "add_key",
                     "request_key", "clone", "clone3"})
#: clone(2) is allowed only without a CLONE_NEW* flag (docker's rule); clone3 says ENOSYS, so
#: that the C library falls back to clone.
CLONE_NEW_FLAGS = 0x7E020000


def seccomp_profile(base: Path = PODMAN_SECCOMP) -> bytes:
    """podman's default filter, tightened to docker's default: no new namespaces, no mounts,
    no keyrings, EPERM (not ENOSYS) for what is refused. Canonical JSON, so its sha256 names it."""
    try:
        profile = json.loads(base.read_bytes())
    except (OSError, ValueError) as e:
        raise ProfileUnavailable(
            f"execution.seccomp: cannot read podman's default profile {base}: {e}"
        ) from None
    rules = []
    for rule in profile.get("syscalls", []):
        names = [n for n in rule.get("names", []) if n not in REFUSED]
        if names:
            rules.append({**rule, "names": names})
    rules += [{"names": ["clone"], "action": "SCMP_ACT_ALLOW",
               "args": [{"index": 0, "value": CLONE_NEW_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
              {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]
    profile.update(syscalls=rules, defaultAction="SCMP_ACT_ERRNO", defaultErrnoRet=1)
    profile.pop("defaultErrno", None)
    return json.dumps(profile, sort_keys=True, separators=(",", ":")).encode()


def write_seccomp(directory: Path) -> tuple[Path, str]:
    """The tightened profile as a file the service can read, named by its digest."""
    data = seccomp_profile()
    digest = hashlib.sha256(data).hexdigest()
    path = directory / f"podman-seccomp-{digest[:16]}.json"
    if not path.is_file():
        directory.mkdir(mode=0o711, parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o644)
        tmp.replace(path)
    return path, f"sha256:{digest}"


def default_host() -> str:
    try:
        uid = pwd.getpwnam(USER).pw_uid
    except KeyError:
        return f"unix:///run/user/{USER}/podman/podman.sock"
    return f"unix:///run/user/{uid}/podman/podman.sock"


def idmap(mapped: list[dict], ids: tuple[int, ...]) -> list[dict]:
    """The container's id map: 0 → the service's own 0 (the user), each of `ids` the service
    holds → the host id of the same number, every other id below 65536 → the service's
    remaining subordinate ids in order (an id outside the user's ranges, e.g. a test's 65532,
    is then some subordinate id: it runs, but owns no host file). `mapped` is the service's
    map (container_id = its id, host_id = the host's)."""
    by_host = {}
    for m in mapped:
        for k in range(int(m["size"])) if int(m["size"]) <= 65536 else ():
            by_host[int(m["host_id"]) + k] = int(m["container_id"]) + k
    inner = {i: by_host[i] for i in ids if i in by_host}
    spare = iter(sorted(set(by_host.values()) - set(inner.values()) - {0}))
    out, cid = [{"container_id": 0, "host_id": 0, "size": 1}], 1
    while cid < 65536:
        if cid in inner:
            out.append({"container_id": cid, "host_id": inner[cid], "size": 1})
        else:
            nxt = next(spare, None)
            if nxt is None:
                break
            out.append({"container_id": cid, "host_id": nxt, "size": 1})
        cid += 1
    return _merge(out)


def _merge(entries: list[dict]) -> list[dict]:
    merged: list[dict] = []
    for e in entries:
        last = merged[-1] if merged else None
        if last and last["container_id"] + last["size"] == e["container_id"] and \
                last["host_id"] + last["size"] == e["host_id"]:
            last["size"] += e["size"]
        else:
            merged.append(dict(e))
    return merged
