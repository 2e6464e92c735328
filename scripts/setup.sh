#!/usr/bin/env bash
# Prepare a fresh Debian 12 machine (as root) for this checkout. Without options, only what
# the README's main job (freeze and a pilot through docker) needs: docker, mmdebstrap (the
# sandbox image), python3-venv; a venv at .venv holding the project; a dockerd that answers;
# the sandbox image. With --test, also what only the test suite (and the other backends and
# `validate sign`) needs: the test extras, bubblewrap (the bwrap backend), openssh-client
# (ssh-keygen), procps and iproute2 (pgrep, ss: the tests' leak checks), a headless browser
# (the viewer's tests), a VM (qemu, busybox-static: bwrap's tests on a cgroup-v2-only kernel),
# gVisor (runsc), rootless podman (its packages, its unprivileged user dv-podman and that
# user's subordinate ids) and Debian's docker-registry (a registry the tests run on loopback).
# Idempotent: a second run only checks. The README's two commands and .ci/run use it.
#
#   bash scripts/setup.sh [--test]
#
#   VALIDATE_IMAGE_DIR     the image store (default /var/lib/deshuffle-validate/images)
#   DOCKER_HOST            the daemon to use (default: the machine's, /var/run/docker.sock)
#   VALIDATE_DOCKERD_ROOT  with DOCKER_HOST=unix://PATH: if nothing answers there, start a
#                          private dockerd on that socket whose data-root, exec-root, pidfile
#                          and log live under this directory (stop it by its pidfile)
set -euo pipefail
cd "$(dirname "$0")/.."

test_extras=0
case "${1:-}" in
  "") ;;
  --test) test_extras=1 ;;
  *) echo "setup: unknown option ${1} (the only option is --test: also install what the test suite needs)" >&2; exit 2 ;;
esac

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v git >/dev/null || need+=(git)  # the code's commit in every contract; `--patches` applies diffs with it
# the harness's own static program in trial containers (validate/taskdir/trial/tool.py): a C compiler and
# the static C library
command -v cc >/dev/null || need+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e "/usr/lib/$(uname -m)-linux-gnu/libc.a" ] || need+=(libc6-dev)
if [ "$test_extras" = 1 ]; then
  command -v bwrap >/dev/null || need+=(bubblewrap)
  command -v setpriv >/dev/null || need+=(util-linux)  # bwrap's drop to the agents' uid
  command -v ssh-keygen >/dev/null || need+=(openssh-client)  # validate sign
  command -v pgrep >/dev/null || need+=(procps)
  command -v ss >/dev/null || need+=(iproute2)
  command -v chromium >/dev/null || need+=(chromium)  # the viewer's tests drive a real headless browser
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)  # a cgroup-v2-only VM tests bwrap on v2
  # the package, not /bin/busybox: Debian's initramfs-tools brings a dynamic busybox, useless as an init
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
  command -v runsc >/dev/null || need+=(runsc)  # gVisor: the docker-gvisor profile's conformance tests
  # the rootless profile (validate.sandbox.podman): podman and its id maps (kernel overlay, no network)
  command -v podman >/dev/null || need+=(podman)
  command -v newuidmap >/dev/null || need+=(uidmap)
  # a real registry on loopback: task images pulled by reference and frozen by digest
  command -v docker-registry >/dev/null || need+=(docker-registry)
fi
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)  # Debian splits venv out
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The project goes into its own venv: Debian's python3 is externally managed (PEP 668).
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
# [smoke] (build, wheel: pure Python) although the main job's pilot needs neither: `validate
# pool`, its next step, ends with the smoke test and would fail only at its end without them.
extras=smoke
[ "$test_extras" = 1 ] && extras=test
if [ "$test_extras" = 1 ]; then
  # The rootless profile's user: container root maps to it; its subordinate ids are a range of
  # its own plus the agents' two uids/gids (65533, 65534), so agents own their files on the
  # host as under docker and bwrap. The attempt storage's parent is a shared mount, so tmpfs
  # mounted there later reach the service's own mount namespace (start the service after this).
  id dv-podman >/dev/null 2>&1 || useradd --system --create-home --home-dir /var/lib/dv-podman \
    --shell /usr/sbin/nologin dv-podman
  for f in /etc/subuid /etc/subgid; do
    grep -q '^dv-podman:' "$f" 2>/dev/null || printf 'dv-podman:100000:65532\ndv-podman:65533:2\n' >>"$f"
  done
  attempts=/run/deshuffle-validate/attempts
  mkdir -p -m 0711 "$attempts"
  findmnt -n -o PROPAGATION --mountpoint "$attempts" 2>/dev/null | grep -q shared ||
    { mount --rbind "$attempts" "$attempts" && mount --make-rshared "$attempts"; }
fi

.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
.venv/bin/python -c "import validate, environment" || { echo "setup: the project did not install" >&2; exit 1; }

start_private_dockerd() {
  local root=$VALIDATE_DOCKERD_ROOT
  mkdir -p "$root"
  # Not the machine's /etc/docker/daemon.json. With runsc installed, this daemon alone gets
  # gVisor's runtime as the docker-gvisor profile needs it (validate/sandbox/docker/gvisor.py).
  if command -v runsc >/dev/null; then
    printf '{"runtimes": {"runsc": {"path": "%s", "runtimeArgs": ["--network=none"]}}}\n' \
      "$(command -v runsc)" >"$root/daemon.json"
  else
    echo '{}' >"$root/daemon.json"
  fi
  local tag
  tag=dv-$(printf %s "$root" | sha256sum | cut -c1-12)
  echo "$tag" >"$root/cgroup-parent"  # for whoever stops this daemon: its cgroups to remove
  echo "setup: starting a private dockerd on $DOCKER_HOST (state under $root)"
  # Own cgroup parent, and own containerd namespaces: a containerd already running on the
  # machine (Debian's containerd.service) would otherwise hold our containers beside its own.
  nohup dockerd --host="$DOCKER_HOST" --data-root="$root/data" --exec-root="$root/x" \
    --pidfile="$root/dockerd.pid" --config-file="$root/daemon.json" \
    --cgroup-parent="/$tag" --containerd-namespace="$tag" --containerd-plugins-namespace="$tag-plugins" \
    --iptables=false --ip6tables=false --bridge=none >"$root/dockerd.log" 2>&1 </dev/null &
  dockerd_log=$root/dockerd.log
}

if ! docker info >/dev/null 2>&1; then
  if [ -n "${VALIDATE_DOCKERD_ROOT:-}" ] && [[ "${DOCKER_HOST:-}" == unix://* ]]; then
    start_private_dockerd
  elif [ -z "${DOCKER_HOST:-}" ] && [ -d /run/systemd/system ]; then
    echo "setup: starting docker.service"
    systemctl start docker
    dockerd_log="journalctl -u docker"
  elif [ -z "${DOCKER_HOST:-}" ]; then
    echo "setup: starting dockerd (no bridge, no iptables: containers get only lo)"
    nohup dockerd --iptables=false --ip6tables=false --bridge=none >/var/log/deshuffle-dockerd.log 2>&1 </dev/null &
    dockerd_log=/var/log/deshuffle-dockerd.log
  else
    echo "setup: DOCKER_HOST=$DOCKER_HOST does not answer (set VALIDATE_DOCKERD_ROOT to start a private dockerd there)" >&2
    exit 1
  fi
  for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see $dockerd_log" >&2; exit 1; }
fi

.venv/bin/validate image build
