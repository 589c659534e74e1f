#!/usr/bin/env bash
# Installs what building and running the project's images needs, when it is missing: podman (an OCI
# engine without a daemon), runc and debootstrap (the local base image when no registry is reachable).
# Debian/Ubuntu only. Called by `make image` and by the container tests, never by `make install`:
# a developer who does not build images does not get a container engine.
#
# It also writes /etc/containers/containers.conf, only when that file is absent, with the settings
# these machines need (crun refuses a hybrid cgroup v1 layout; the default RLIMIT_NOFILE of 1048576
# is above the hard limit of some hosts). An existing file is never touched: scripts/podman.sh
# passes the same settings as flags.
set -euo pipefail

need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else SUDO=; fi
else
  SUDO=
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "container-deps: installing ${need[*]}" >&2
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    echo "container-deps: ${need[*]} missing and not root: install them with apt-get" >&2; exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" uidmap slirp4netns fuse-overlayfs >&2
fi

conf=/etc/containers/containers.conf
if [ ! -e "$conf" ] && [ "$(id -u)" -eq 0 -o -n "$SUDO" ]; then
  echo "container-deps: writing $conf (runc, cgroupfs, ulimits)" >&2
  $SUDO mkdir -p /etc/containers
  printf '%s\n' \
    '# Written by the cdc project (scripts/container-deps.sh) because the file was absent.' \
    '[containers]' \
    'default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]' \
    '[engine]' \
    'cgroup_manager = "cgroupfs"' \
    'runtime = "runc"' | $SUDO tee "$conf" >/dev/null
fi
