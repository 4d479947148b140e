"""Regenerate (or check) the checked-in etcd gRPC stubs in ``cellstate/kv/etcdpb``.

Usage::

    python -m cellstate.kv.regen_etcdpb          # rewrite cellstate/kv/etcdpb from protos/
    python -m cellstate.kv.regen_etcdpb --check  # exit 1 if the checked-in files are stale

The sources are the hand-written subset of etcd's API in ``protos/etcd`` (proto root;
files ``etcdserverpb/rpc.proto``, ``mvccpb/kv.proto``, ``authpb/auth.proto``). protoc
names the generated modules after the proto paths (``from mvccpb import kv_pb2``), which
would need ``protos/etcd`` on ``sys.path``; so the output is post-processed to import
through the package (``from cellstate.kv.etcdpb.mvccpb import kv_pb2``). It must be run
with the grpcio-tools pinned in pyproject.toml (the generated code records the protobuf
version it was made with).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from cellstate import protogen

PACKAGE = "cellstate.kv.etcdpb"
PROTO_FILES = ("authpb/auth.proto", "mvccpb/kv.proto", "etcdserverpb/rpc.proto")
# The first path component of each proto file is its proto package and becomes a
# Python subpackage of PACKAGE.
SUBPACKAGES = tuple(sorted({p.split("/", 1)[0] for p in PROTO_FILES}))

_PKG_RE = "|".join(SUBPACKAGES)
# `from mvccpb import kv_pb2 as ...` -> `from cellstate.kv.etcdpb.mvccpb import kv_pb2 as ...`
_IMPORT_RE = re.compile(rf"^from ({_PKG_RE}) import ", re.MULTILINE)
# The module name protoc passes to the builder becomes the classes' __module__; make it
# the real import path so that repr() and pickling name a module that exists.
_MODULE_NAME_RE = re.compile(rf"'({_PKG_RE})\.(\w+_pb2)'")
_LEFTOVER_RE = re.compile(rf"^(?:from|import) (?:{_PKG_RE})\b", re.MULTILINE)


def _rewrite(text: str) -> str:
    text = _IMPORT_RE.sub(rf"from {PACKAGE}.\1 import ", text)
    text = _MODULE_NAME_RE.sub(rf"'{PACKAGE}.\1.\2'", text)
    if _LEFTOVER_RE.search(text):  # a protoc change we do not know how to fix up
        raise RuntimeError("generated code still has a top-level proto package import")
    return text


STUBS = protogen.StubSet(
    command="python -m cellstate.kv.regen_etcdpb",
    proto_root=protogen.PROTOS / "etcd",
    proto_files=PROTO_FILES,
    service_files=("etcdserverpb/rpc.proto",),
    out_dir=Path(__file__).resolve().parent / "etcdpb",
    place=lambda rel: rel,
    rewrite=_rewrite,
    extra_files=(
        ("__init__.py", '"""gRPC/protobuf stubs for a subset of etcd v3\'s API."""\n'),
        *((f"{sub}/__init__.py", "") for sub in SUBPACKAGES),
    ),
)


def generate() -> dict[str, str]:
    return STUBS.generate()


diff = protogen.diff


def main(argv: Sequence[str] | None = None) -> int:
    return protogen.main(STUBS, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
