"""Regenerate (or check) the checked-in stubs of our own API in ``cellstate/api/pb``.

Usage::

    python -m cellstate.api.regen          # rewrite cellstate/api/pb from protos/omega
    python -m cellstate.api.regen --check  # exit 1 if the checked-in files are stale

The source is ``protos/omega/cellstate/v1/cellstate.proto`` (package
``omega.cellstate.v1``). protoc would write ``omega/cellstate/v1/cellstate_pb2.py`` and
have the gRPC module import it as ``from omega.cellstate.v1 import ...``; the output is
flattened into ``cellstate/api/pb/v1/`` and imports through our package instead.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from cellstate import protogen

PACKAGE = "cellstate.api.pb"
_PROTO_DIR = "omega/cellstate/"
_IMPORT_RE = re.compile(r"^from omega\.cellstate\.(v\d+) import ", re.MULTILINE)
_MODULE_NAME_RE = re.compile(r"'omega\.cellstate\.(v\d+)\.(\w+_pb2)'")
_LEFTOVER_RE = re.compile(r"^(?:from|import) omega\b", re.MULTILINE)


def _place(rel: str) -> str:
    if not rel.startswith(_PROTO_DIR):
        raise RuntimeError(f"unexpected generated file {rel}")
    return rel.removeprefix(_PROTO_DIR)


def _rewrite(text: str) -> str:
    text = _IMPORT_RE.sub(rf"from {PACKAGE}.\1 import ", text)
    text = _MODULE_NAME_RE.sub(rf"'{PACKAGE}.\1.\2'", text)
    if _LEFTOVER_RE.search(text):
        raise RuntimeError("generated code still has a top-level proto package import")
    return text


STUBS = protogen.StubSet(
    command="python -m cellstate.api.regen",
    proto_root=protogen.PROTOS,
    proto_files=("omega/cellstate/v1/cellstate.proto",),
    service_files=("omega/cellstate/v1/cellstate.proto",),
    out_dir=Path(__file__).resolve().parent / "pb",
    place=_place,
    rewrite=_rewrite,
    extra_files=(
        ("__init__.py", '"""gRPC/protobuf stubs of the cellstate API (protos/omega)."""\n'),
        ("v1/__init__.py", ""),
    ),
)


def main(argv: Sequence[str] | None = None) -> int:
    return protogen.main(STUBS, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
