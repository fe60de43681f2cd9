#!/usr/bin/env bash
# The package installs from the checkout into a clean virtual environment that sees the
# system's packages (grpcio, protobuf, numpy), offline, and works from outside the checkout.
#   install_test.sh [PYTHON]   (default /usr/bin/python3)
set -euo pipefail
python="${1:-/usr/bin/python3}"
package="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpucompute-install-XXXXXX")"
trap 'rm -rf "$work"' EXIT
# A copy, so that the build leaves nothing in the checkout.
cp -r "$package" "$work/src"
rm -rf "$work/src/build" "$work/src/"*.egg-info
"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --no-index --no-build-isolation "$work/src"
cd "$work"
"$work/venv/bin/python" - "$work/venv" <<'PY'
import sys
import numpy as np
import gpucompute, gpucompute.aio
from gpucompute import ops
from gpucompute.v1 import compute_pb2
venv = sys.argv[1]
assert gpucompute.__file__.startswith(venv), gpucompute.__file__
assert ops.gemm(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)).method == "Gemm"
assert compute_pb2.GemmRequest.FromString(compute_pb2.GemmRequest(beta=1).SerializeToString()).beta == 1
print("installed at", gpucompute.__file__)
PY
"$work/venv/bin/python" -m gpucompute.bench --help > /dev/null
# The transfer worker's entry point is installed, and a worker whose client is gone exits.
"$work/venv/bin/python" -m gpucompute._worker_main < /dev/null
test -x "$work/venv/bin/gpucompute-py-bench"
