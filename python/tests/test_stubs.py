"""The committed stubs in kvfabric._pb are those of the .proto sources."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from kvfabric._pb.fabric.fabricpb import engine_pb2, engine_pb2_grpc
from kvfabric._pb.layout.layoutpb import layout_pb2

REPO = Path(__file__).resolve().parent.parent.parent


def without_json_names(f: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """protoc's descriptor sets carry json_name, generated code does not."""

    def strip(msgs):
        for m in msgs:
            for fld in m.field:
                fld.ClearField("json_name")
            strip(m.nested_type)

    strip(f.message_type)
    return f


@pytest.mark.parametrize("module", [engine_pb2, layout_pb2], ids=["engine", "layout"])
def test_stubs_match_protos(module, tmp_path):
    protoc = shutil.which("protoc")
    if protoc is None:
        pytest.skip("protoc is not installed (make proto-deps installs it)")
    name = module.DESCRIPTOR.name
    out = tmp_path / "set.pb"
    subprocess.run([protoc, "-I", str(REPO), f"--descriptor_set_out={out}", name], check=True, cwd=REPO)
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    want = fds.file[0]
    got = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(got)
    assert without_json_names(got) == without_json_names(want), f"{name}: kvfabric._pb is stale; run make proto"


def test_every_rpc_has_a_stub():
    rpcs = {m.name for m in engine_pb2.DESCRIPTOR.services_by_name["Engine"].methods}
    stub = engine_pb2_grpc.EngineStub.__init__.__code__.co_names
    assert rpcs <= set(stub), rpcs - set(stub)
