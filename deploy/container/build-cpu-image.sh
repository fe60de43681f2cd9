#!/usr/bin/env bash
# Builds the CPU-only target of the Dockerfile with buildah (no Docker engine
# and no image registry needed), on a Debian 12 base image made here with
# debootstrap, then starts the server from the image and calls it with the
# CLI. Runs as root; installs debootstrap and buildah when missing.
#   deploy/container/build-cpu-image.sh [--base-only] [WORKDIR]
# --base-only: stop once the base image exists.
# podman run does not work on the development machine (crun: setrlimit and
# cgroup errors), so the server runs through `buildah run --isolation chroot`,
# which shares the host network.
set -euo pipefail
cd "$(dirname "$0")/../.."
base_only=false
if [ "${1:-}" = --base-only ]; then
  base_only=true
  shift
fi
work=${1:-/tmp/gpucompute-container}
storage=(--storage-driver vfs)
mkdir -p "$work"

need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v buildah >/dev/null || need+=(buildah)
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

# The base image: Debian 12 from the mirror this machine's apt uses.
base=localhost/gpucompute-base:bookworm
if ! buildah "${storage[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
             /etc/apt/sources.list.d/*.list 2>/dev/null |
           grep -oE '^(deb|URIs:) +https?://[^ ]+/debian/?( |$)' | head -1 | awk '{print $2}' || true)
  [ -n "$mirror" ] || { echo "no Debian mirror in /etc/apt/sources.list*" >&2; exit 1; }
  rm -rf "$work/rootfs"
  time debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror"
  echo "deb $mirror bookworm main" >"$work/rootfs/etc/apt/sources.list"
  ctr=$(buildah "${storage[@]}" from scratch)
  mnt=$(buildah "${storage[@]}" mount "$ctr")
  cp -a "$work/rootfs/." "$mnt/"
  buildah "${storage[@]}" umount "$ctr"
  buildah "${storage[@]}" commit "$ctr" "$base"
  buildah "${storage[@]}" rm "$ctr"
fi

if $base_only; then
  echo "build-cpu-image: $base is there"
  exit 0
fi

# The CPU target of the Dockerfile.
image=localhost/gpucompute:cpu
time buildah "${storage[@]}" bud --isolation chroot --format docker \
  --build-arg BUILD_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" --build-arg PRESET=cpu \
  --build-arg REVISION="$(git rev-parse --short=12 HEAD 2>/dev/null || true)" \
  -t "$image" .

# Serve from the image and call it from the image.
ctr=$(buildah "${storage[@]}" from "$image")
trap 'kill "${server_pid:-}" 2>/dev/null || true; buildah "${storage[@]}" rm "$ctr" >/dev/null' EXIT
port=$((20000 + RANDOM % 20000))
buildah "${storage[@]}" run --isolation chroot "$ctr" -- gpucompute-server \
  --listen="127.0.0.1:$port" --metrics_listen="127.0.0.1:$((port + 1))" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  grep -q "listening on" "$work/server.log" && break
  sleep 0.2
done
cat "$work/server.log"
buildah "${storage[@]}" run --isolation chroot "$ctr" -- \
  gpucompute --server="127.0.0.1:$port" gemm --m=256 --n=256 --k=256 --check
buildah "${storage[@]}" run --isolation chroot "$ctr" -- \
  gpucompute --server="127.0.0.1:$port" health
echo "build-cpu-image: $image built, served and answered"
