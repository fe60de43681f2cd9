#!/usr/bin/env bash
# Installs what gpucompute needs to build and test on Debian 12 / Ubuntu 24.04:
# only the packages that are missing. The CUDA toolkit is not installed here:
# when /usr/local/cuda/bin/nvcc exists the CUDA kernels are built too.
#   deploy/install-deps.sh         build and test
#   deploy/install-deps.sh build   build only (the container image)
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  exec sudo --preserve-env=DEBIAN_FRONTEND "$0" "$@"
fi

packages=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev prometheus-cpp-dev libopenblas-dev libssl-dev
  prometheus
  python3 python3-venv python3-grpcio python3-protobuf python3-numpy python3-pytest
)

# The fuzz targets (tests/fuzz): clang with libFuzzer and the sanitizer
# runtimes, for the tests only.
if [ "${1:-}" != build ]; then
  packages+=(clang libclang-rt-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Tools the deployment tests run, taken from wherever they come when present
# (another kubectl, Node.js from elsewhere): kubectl renders the Kubernetes
# overlays; node and npm run the manifest checker and the live Prometheus
# test (its npm packages install at test time, from package-lock.json).
if [ "${1:-}" != build ]; then
  command -v openssl >/dev/null || missing+=(openssl)  # the TLS tests' certificates
  command -v kubectl >/dev/null || missing+=(kubernetes-client)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
fi

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: everything is installed"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
