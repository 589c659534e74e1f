#!/usr/bin/env bash
# Builds the local base image the project's Dockerfiles use when no container registry is
# reachable: Debian bookworm (minbase) plus Python 3.11 and venv, from the Debian mirror apt
# already uses on this machine, imported into podman. Prints the image's name on stdout.
#
# The image is cached: its tag carries a hash of this recipe (the script itself and the package
# list), so it is rebuilt only when the recipe changes; the root filesystem tarball is kept under
# ${CDC_CACHE_DIR:-~/.cache/cdc}/base so that a wiped podman store re-imports it in seconds.
set -euo pipefail

suite=bookworm
packages=python3,python3-venv,ca-certificates
here=$(cd "$(dirname "$0")" && pwd)
recipe_hash=$( { cat "$here/base-image.sh"; echo "$suite $packages"; } | sha256sum | cut -c1-12)
image="localhost/cdc-base:${suite}-${recipe_hash}"
cache="${CDC_CACHE_DIR:-$HOME/.cache/cdc}/base"
tarball="$cache/${suite}-${recipe_hash}.tar"
podman=(podman --runtime runc --cgroup-manager cgroupfs)

if "${podman[@]}" image exists "$image"; then
  echo "$image"; exit 0
fi

if [ ! -s "$tarball" ]; then
  # The mirror apt uses here (deb822 sources or the classic list), never a host named in the project.
  mirror=$(grep -hoE '^URIs:[[:space:]]*\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null \
             | awk '{print $2}' | grep -v security | head -n1 || true)
  if [ -z "$mirror" ]; then
    mirror=$(grep -hE '^deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
               | awk '{print $2}' | grep -v security | head -n1 || true)
  fi
  if [ -z "$mirror" ]; then
    echo "base-image: no Debian mirror found in /etc/apt/sources.list*; pass one as DEBIAN_MIRROR=" >&2
    exit 1
  fi
  mirror=${DEBIAN_MIRROR:-$mirror}
  mkdir -p "$cache"
  rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$rootfs" "$tarball.part"' EXIT
  echo "base-image: debootstrap $suite from $mirror (once per recipe; ~30-60 s)" >&2
  debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >&2
  # Smaller and reproducible-ish: no apt lists, caches or logs in the image.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
         "$rootfs"/var/log/*.log "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
  tar --numeric-owner -C "$rootfs" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi

echo "base-image: importing $tarball as $image" >&2
"${podman[@]}" import --change 'CMD ["/bin/bash"]' "$tarball" "$image" >&2
echo "$image"
