"""The rootless profile (package): `backend` the class, `service` what is said to the rootless
service (id maps, syscall filter), `limits` the gate into the harness's cgroups.

The rootless profile: podman run by an unprivileged user, driven through its REST socket.

The service (``podman system service``) runs as an unprivileged user (set-up creates
``dv-podman``) whose subordinate ids include the agents' own uids: the container's root is
that user, container uids 65533 and 65534 are the same host uids as under docker and bwrap
(so the attempt's files, their owners and the answer key's ``0400`` mean the same), and every
other container uid is one of the user's subordinate ids (`idmap`). The service must hold the
agents' gids as supplementary groups to reach the attempt storage (``0710 root:<gid>``).

The harness speaks the Docker API to it (the docker SDK: start, wait, inspect, logs, exec,
archives), so the one-shot runs, sessions and the judging of an exit are the docker backend's
(`DockerSandbox`); only the container's creation goes through podman's own endpoint, the one
that takes uid and gid maps.

Limits. Rootless podman on cgroup v1 *ignores* ``--memory``, ``--pids-limit`` and
``--cpus`` (it says so on the CLI, and nothing through the API), so none is asked of it: the
harness (root) makes one cgroup per container (`validate.sandbox.cgroups`, memory with no
swap, pids, cpu quota) and moves the agent's first process and each exec'd command into it
before they run anything: each starts as a gate (`limits.GATE`) that waits until
``/proc/self/cgroup`` shows the group, then execs the agent. The watchdog (PID 1) stays
outside the group, so a harness killed before the join still leaves nothing past the backstop. Without root there is no way to
enforce them and `facts` refuses the profile, naming the limits. Storage is the harness's
size- and inode-capped tmpfs (``/tmp`` too: podman's tmpfs takes no inode cap), file size is
RLIMIT_FSIZE (rlimits do bite rootless), the timeout the harness's plus the watchdog's.
"""

from validate.sandbox.podman.backend import PodmanSandbox
from validate.sandbox.podman.service import HOST_ENV, USER, idmap, seccomp_profile

__all__ = ["HOST_ENV", "USER", "PodmanSandbox", "idmap", "seccomp_profile"]
