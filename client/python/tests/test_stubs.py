"""The generated stubs: they match the proto, and they work on this runtime."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from gpucompute.v1 import compute_pb2 as pb
from gpucompute.v1 import compute_pb2_grpc

PACKAGE = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not (shutil.which("protoc") and shutil.which("grpc_python_plugin")),
                    reason="protoc or grpc_python_plugin is not installed")
def test_shipped_stubs_match_the_proto(tmp_path):
    subprocess.run([str(PACKAGE / "tools" / "generate_stubs.sh"), str(tmp_path)], check=True)
    for name in ("compute_pb2.py", "compute_pb2_grpc.py"):
        fresh = (tmp_path / "gpucompute" / "v1" / name).read_text()
        shipped = (PACKAGE / "gpucompute" / "v1" / name).read_text()
        assert fresh == shipped, (f"gpucompute/v1/{name} is stale: run "
                                  "client/python/tools/generate_stubs.sh")


def test_messages_round_trip_on_this_runtime():
    req = pb.GemmRequest(a=pb.Tensor(dtype=pb.BFLOAT16, shape=[2, 3], data=b"x" * 12),
                         alpha=0.5, options=pb.OpOptions(keep_output=True, devices=[1]))
    back = pb.GemmRequest.FromString(req.SerializeToString())
    assert back == req and back.HasField("alpha") and not back.HasField("c")
    assert pb.DType.Name(pb.FLOAT16) == "FLOAT16"
    assert pb.BatchRequest(gemm=req).WhichOneof("op") == "gemm"
    assert hasattr(compute_pb2_grpc, "ComputeStub")
    assert [m.name for m in pb.DESCRIPTOR.services_by_name["Compute"].methods][:2] == [
        "Gemm", "Gemv"]
