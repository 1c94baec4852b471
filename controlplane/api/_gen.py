"""Generates edge_pb2.py and edge_pb2_grpc.py from edge/v1/edge.proto with grpcio-tools.

Not imported at run time: the generated modules are committed next to this file,
and controlplane.api imports only those. After changing the proto, regenerate
them in place and commit:

    python -m controlplane.api._gen

grpcio-tools is a test dependency (pip install -e .[test]);
tests/test_api_generated.py regenerates into a temporary directory and fails on
any difference from the committed modules.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_NAME = "edge/v1/edge.proto"  # relative to HERE, which is protoc's -I
MODULES = ("edge_pb2", "edge_pb2_grpc")

# protoc writes `from edge.v1 import edge_pb2 as ...` (an absolute import of the
# proto's package path); the modules live in controlplane.api, so make it relative.
_ABSOLUTE_IMPORT = re.compile(r"^from edge\.v1 import edge_pb2 as ", re.M)


def generate(dest: Path) -> None:
    """Writes the modules generated from the proto into dest (an existing directory)."""
    from grpc_tools import protoc

    include = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    with tempfile.TemporaryDirectory(prefix="edge-api-gen-") as stage:
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{HERE}",
                f"-I{include}",
                f"--python_out={stage}",
                f"--grpc_python_out={stage}",
                PROTO_NAME,
            ]
        )
        if rc != 0:
            raise SystemExit(f"protoc failed on {HERE / PROTO_NAME} (exit {rc}; its messages are above)")
        out = Path(stage) / Path(PROTO_NAME).parent
        grpc_py = out / "edge_pb2_grpc.py"
        text, n = _ABSOLUTE_IMPORT.subn("from . import edge_pb2 as ", grpc_py.read_text())
        if n != 1:
            raise SystemExit(f"unexpected import of edge_pb2 in protoc's output ({n} found)")
        grpc_py.write_text(text)
        for m in MODULES:
            shutil.copyfile(out / f"{m}.py", Path(dest) / f"{m}.py")


def main() -> int:
    generate(HERE)
    print(f"wrote {', '.join(m + '.py' for m in MODULES)} in {os.path.relpath(HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
