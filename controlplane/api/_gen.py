"""Builds edge_pb2.py and edge_pb2_grpc.py from edge/v1/edge.proto and imports them.

The generated modules are never committed or edited: on first import protoc
(grpc_tools, in-process) writes them into api/_generated/ (git-ignored), or,
when the package directory is read-only, into a per-user cache directory. A
STAMP file holds the proto's sha256 and the generator's version; when either
changes the modules are generated again. A lock file keeps two processes from
generating into one directory at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from types import ModuleType

from controlplane.errors import EdgeError

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE                      # -I for protoc; the proto's name is relative to it
PROTO_NAME = "edge/v1/edge.proto"
PROTO = PROTO_ROOT / PROTO_NAME
PACKAGE = "controlplane.api"
MODULES = ("edge_pb2", "edge_pb2_grpc")
STAMP = "STAMP"

# protoc writes `from edge.v1 import edge_pb2 as ...` (an absolute import of the
# proto's package path); the modules live in controlplane.api, so make it relative.
_ABSOLUTE_IMPORT = re.compile(r"^from edge\.v1 import edge_pb2 as ", re.M)


def stamp(proto: Path = PROTO) -> str:
    """What the generated modules were made from: the proto's sha256 and the generator."""
    import google.protobuf

    digest = hashlib.sha256(proto.read_bytes()).hexdigest()
    return (f"proto-sha256 {digest}\n"
            f"grpcio-tools {_version('grpcio-tools')}\n"
            f"protobuf {google.protobuf.__version__}\n")


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def is_fresh(dest: Path, proto: Path = PROTO) -> bool:
    """Whether dest holds modules generated from this proto by this generator."""
    try:
        current = (dest / STAMP).read_text()
    except OSError:
        return False
    return current == stamp(proto) and all((dest / f"{m}.py").is_file() for m in MODULES)


def ensure(dest: Path, proto: Path = PROTO) -> Path:
    """Generates the modules into dest unless they are fresh; returns dest. Raises OSError
    when dest cannot be written, EdgeError when protoc fails."""
    if is_fresh(dest, proto):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_fresh(dest, proto):  # another process may have finished meanwhile
            _generate(dest, proto)
    return dest


def _generate(dest: Path, proto: Path) -> None:
    from grpc_tools import protoc

    include = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    root = proto.parents[len(Path(PROTO_NAME).parts) - 1]
    stage = Path(tempfile.mkdtemp(prefix=".stage-", dir=dest))
    try:
        rc = protoc.main(["grpc_tools.protoc", f"-I{root}", f"-I{include}",
                          f"--python_out={stage}", f"--grpc_python_out={stage}", PROTO_NAME])
        if rc != 0:
            raise EdgeError(f"api: protoc failed on {proto} (exit {rc}; its messages are above)")
        out = stage / Path(PROTO_NAME).parent
        grpc_py = out / "edge_pb2_grpc.py"
        text, n = _ABSOLUTE_IMPORT.subn("from . import edge_pb2 as ", grpc_py.read_text())
        if n != 1:
            raise EdgeError(f"api: unexpected import of edge_pb2 in protoc's output ({n} found)")
        grpc_py.write_text(text)
        (dest / STAMP).unlink(missing_ok=True)  # stale until every module is in place
        for m in MODULES:
            os.replace(out / f"{m}.py", dest / f"{m}.py")
        (stage / STAMP).write_text(stamp(proto))
        os.replace(stage / STAMP, dest / STAMP)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def candidates() -> list[Path]:
    """Where the modules may live, in order: the package, then per-user caches. A cache
    directory is named after the stamp, so installs of another proto never share one."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(stamp().encode()).hexdigest()[:12]
    return [HERE / "_generated",
            Path(cache) / "edge-router" / f"api-{digest}",
            Path(tempfile.gettempdir()) / f"edge-router-api-{os.getuid()}-{digest}"]


def _private(dest: Path) -> None:
    """A directory in a shared place (/tmp) must be ours and closed to others."""
    if dest.parent == Path(tempfile.gettempdir()):
        dest.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(dest)
        if st.st_uid != os.getuid() or not os.path.isdir(dest) or os.path.islink(dest) or st.st_mode & 0o022:
            raise PermissionError(f"{dest} is not a private directory of this user")


def find_or_generate(dirs: list[Path] | None = None) -> Path:
    """The first directory holding fresh modules, else the first one they can be generated in."""
    dirs = candidates() if dirs is None else dirs
    for d in dirs:
        if is_fresh(d):
            return d
    problems = []
    for d in dirs:
        try:
            _private(d)
            return ensure(d)
        except OSError as e:
            problems.append(f"{d}: {e.strerror or e}")
    raise EdgeError(f"api: cannot generate the gRPC modules anywhere ({'; '.join(problems)})")


def _import(name: str, path: Path) -> ModuleType:
    full = f"{PACKAGE}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    spec = importlib.util.spec_from_file_location(full, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise
    return module


def load() -> tuple[ModuleType, ModuleType]:
    """edge_pb2 and edge_pb2_grpc, generated first if needed, as controlplane.api.*."""
    d = find_or_generate()
    return tuple(_import(m, d / f"{m}.py") for m in MODULES)
