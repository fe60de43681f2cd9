#!/usr/bin/env bash
# Renders every overlay and optional part of deploy/kubernetes with
# `kubectl kustomize` and checks the output (check-manifests.js: the API
# schemas, unknown fields, gpucompute's rules), after a self-test that the
# checks catch what they should.
#   deploy/kubernetes/check/check.sh WORKDIR [SERVER_BINARY [CLI_BINARY]]
# With both binaries, the probes of the overlays that serve TLS also run
# against a live server (probe-live.js).
# WORKDIR holds the checker's npm packages (installed from package-lock.json
# on first use, and again when the lock changes) and the renders.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kube=$(dirname "$here")
work=${1:?usage: check.sh WORKDIR [SERVER_BINARY]}
server=${2:-}
cli=${3:-}
mkdir -p "$work/rendered"

kubectl=${KUBECTL:-$(command -v kubectl || true)}
if [ -z "$kubectl" ]; then
  echo "check.sh: kubectl not found (deploy/install-deps.sh installs Debian's kubernetes-client)" >&2
  exit 1
fi
if ! command -v npm >/dev/null; then
  echo "check.sh: npm not found (deploy/install-deps.sh installs it)" >&2
  exit 1
fi

# The checker's packages, exactly as locked.
stamp="$work/node_modules/.gpucompute-lock"
if ! cmp -s "$here/package-lock.json" "$stamp" 2>/dev/null; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  echo "check.sh: installing the checker's npm packages into $work"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$here/package-lock.json" "$stamp"
fi
cp "$here/check-manifests.js" "$here/probe-live.js" "$work/"

echo "check.sh: $("$kubectl" version --client 2>/dev/null | head -1)"
rendered=()
for dir in "$kube"/overlays/* "$kube"/optional/*; do
  name=$(basename "$(dirname "$dir")")-$(basename "$dir")
  out="$work/rendered/$name.yaml"
  # Newer kubectl warns that this dialect is deprecated: not an error.
  if ! "$kubectl" kustomize "$dir" >"$out" 2>"$out.log"; then
    echo "check.sh: kubectl kustomize ${dir#"$kube"/} failed:" >&2
    cat "$out.log" >&2
    exit 1
  fi
  echo "check.sh: rendered ${dir#"$kube"/}: $(grep -c '^kind:' "$out") objects"
  rendered+=("$out")
done

args=()
[ -n "$server" ] && args+=("--server=$server")
if [ -n "$server" ]; then
  node "$work/check-manifests.js" "${args[@]}" --self-test "$work/rendered/overlays-gpu-node.yaml"
fi
node "$work/check-manifests.js" "${args[@]}" "${rendered[@]}"
if [ -n "$server" ] && [ -n "$cli" ]; then
  for out in "${rendered[@]}"; do
    if grep -q -- "--tls_cert=" "$out"; then node "$work/probe-live.js" "$out" "$server" "$cli"; fi
  done
fi
