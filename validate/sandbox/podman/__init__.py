"""The rootless profile: podman run by an unprivileged user, driven through its REST socket.
`backend` holds the class, `service` what is said to the service beyond the Docker API (id
maps, the syscall filter), `limits` the gate into the harness's own cgroups.

Identity. The service (``podman system service``) runs as an unprivileged user (set-up
creates ``dv-podman``) whose subordinate ids include the agents' own uids and gids: the
container's root is that user, container ids 65533 and 65534 are the same host ids as under
docker and bwrap (so the attempt's files, their owners and the answer key's ``0400`` mean
the same), every other container id is one of the user's other subordinate ids (`idmap`).
The service holds the agents' gids as supplementary groups, to reach the attempt storage
(``0710 root:<gid>``). The attempt storage is mounted after the service made its own mount
namespace, so it reaches the service only through a shared parent mount (set-up makes
``/run/deshuffle-validate/attempts`` one; `facts` refuses the profile otherwise).

API. The harness speaks the Docker API to the service (the docker SDK: start, wait,
inspect, logs, exec, archives), so one-shot runs, sessions and the judging of an exit are
the docker backend's (`DockerSandbox`); only the creation goes through podman's own
endpoint, the one that takes uid and gid maps and a syscall filter. The filter is podman's
default tightened to docker's (podman's allows unshare, mount and keyctl, relying on
capabilities a rootless container holds in its own user namespace).

Limits. Rootless podman on cgroup v1 *ignores* ``--memory``, ``--pids-limit`` and
``--cpus`` (it says so on the CLI, and nothing through the API), so none is asked of it: the
harness (root) makes one cgroup per container (`validate.sandbox.cgroups`: memory with no
swap, pids, cpu quota) and moves the agent's first process and each exec'd command into it
before they run anything: each starts as a gate (`limits.GATE`) that waits until
``/proc/self/cgroup`` shows the group, then execs the agent. The watchdog (PID 1) stays
outside the group, so a harness killed before the join still leaves nothing past the
backstop. Without root nothing can enforce them, and `facts` refuses the profile naming the
limits. Storage is the harness's size- and inode-capped tmpfs (``/tmp`` too: podman's tmpfs
takes no inode cap), file size RLIMIT_FSIZE (rlimits do bite rootless), the timeout the
harness's plus the watchdog's. `BackendFacts.isolation` records all of it.

Harbor trials (`validate.taskdir.trial.run`) speak only the Docker API to the service; `limits.PodmanAPI`
makes up what podman 4.3 does differently there: the limits a trial container asks go on the
harness's own group (PID 1 and every exec join it), an exec is waited for attached (a
detached one is never reported ended), a fresh volume is mounted ``nocopy`` (else podman
fills it from the snapshot) with the uploads before the start made at the start, and a
snapshot is removed with libpod's ``noprune`` (else its untagged task image goes with it).
"""

from validate.sandbox.podman.backend import PodmanSandbox
from validate.sandbox.podman.service import HOST_ENV, USER, idmap, seccomp_profile

__all__ = ["HOST_ENV", "USER", "PodmanSandbox", "idmap", "seccomp_profile"]
