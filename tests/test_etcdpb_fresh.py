"""The checked-in etcd stubs (cellstate/kv/etcdpb) match protos/etcd, and the protos
keep etcd's wire format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cellstate.kv import regen_etcdpb
from cellstate.kv.etcdpb.etcdserverpb import rpc_pb2 as pb
from cellstate.kv.etcdpb.mvccpb import kv_pb2

ROOT = Path(__file__).resolve().parents[1]


def test_checked_in_stubs_are_fresh() -> None:
    # The real command, as CI and a developer would run it.
    proc = subprocess.run(
        [sys.executable, "-m", "cellstate.kv.regen_etcdpb", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_notices_changes() -> None:
    fresh = regen_etcdpb.generate()
    changed = dict(fresh)
    changed["etcdserverpb/rpc_pb2.py"] += "# edited by hand\n"
    del changed["mvccpb/kv_pb2.py"]
    changed["mvccpb/old_pb2.py"] = ""
    assert regen_etcdpb.diff(fresh, fresh) == []
    assert regen_etcdpb.diff(fresh, changed) == [
        "missing: mvccpb/kv_pb2.py",
        "not generated (stale?): mvccpb/old_pb2.py",
        "differs: etcdserverpb/rpc_pb2.py",
    ]


def test_wire_format_matches_etcd() -> None:
    # Field numbers from etcd's rpc.proto / kv.proto: (number << 3 | wire type) bytes.
    assert pb.Compare(mod_revision=5).SerializeToString() == b"\x30\x05"
    assert pb.Compare(range_end=b"z").SerializeToString() == b"\x82\x04\x01z"  # field 64
    assert pb.RequestOp(request_put=pb.PutRequest(key=b"k")).SerializeToString() == (
        b"\x12\x03\x0a\x01k"
    )
    assert pb.WatchResponse(compact_revision=7).SerializeToString() == b"\x28\x07"
    assert kv_pb2.KeyValue(lease=1).SerializeToString() == b"\x30\x01"
    assert pb.WatchResponse.DESCRIPTOR.fields_by_name["events"].number == 11
    assert pb.DESCRIPTOR.package == "etcdserverpb"
    assert kv_pb2.DESCRIPTOR.package == "mvccpb"
    assert pb.DESCRIPTOR.services_by_name["KV"].full_name == "etcdserverpb.KV"
    # Maintenance (cellstate/maintenance.py): alarms, defragmentation, member sizes.
    alarm = pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=1, alarm=pb.NOSPACE)
    assert alarm.SerializeToString() == b"\x08\x02\x10\x01\x18\x01"
    assert pb.AlarmResponse(alarms=[pb.AlarmMember(memberID=2, alarm=pb.CORRUPT)]) \
        .SerializeToString() == b"\x12\x04\x08\x02\x10\x02"
    assert pb.StatusResponse(dbSize=3, dbSizeInUse=4).SerializeToString() == b"\x18\x03\x48\x04"
    methods = pb.DESCRIPTOR.services_by_name["Maintenance"].methods_by_name
    assert sorted(methods) == ["Alarm", "Defragment", "Status"]
