#!/usr/bin/env bash
# Prepare a fresh Debian 12 machine (as root): system packages, dockerd, the project, the
# sandbox image. Idempotent: a second run only checks. Used by the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v pgrep >/dev/null || need+=(procps)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd (no bridge, no iptables: containers get only lo)"
  nohup dockerd --iptables=false --ip6tables=false --bridge=none >/var/log/deshuffle-dockerd.log 2>&1 &
  echo $! > /var/run/deshuffle-dockerd.pid
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see /var/log/deshuffle-dockerd.log" >&2; exit 1; }
fi

python3 -m pip install -q -e '.[test]' 2>&1 | grep -v -e '^WARNING' -e 'pip as the' || true
python3 -c "import validate, environment" || { echo "setup: the project did not install" >&2; exit 1; }
validate image build
