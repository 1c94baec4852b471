"""Which module may import which, read from the source with ast (nothing is imported):
bcc only in controlplane/loader.py; the pure modules, and every controlplane module they
import, import nothing that reaches the kernel, a file, the network or another process;
the product (everything outside controlplane/lab/, controlplane/tests/, tools/ and
netns-tests/) never imports the lab. An import under `if TYPE_CHECKING:` does not run and
does not count."""

from __future__ import annotations

import ast
import functools
import subprocess
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]

# Pure: no kernel, no I/O; importable and tested without root (STYLE.md, principle 3).
PURE = [
    "controlplane/abi.py",
    "controlplane/config.py",
    "controlplane/confighealth.py",
    "controlplane/configkit.py",
    "controlplane/desired.py",
    "controlplane/discovery/cache.py",
    "controlplane/discovery/tokens.py",
    "controlplane/errors.py",
    "controlplane/limits.py",
    "controlplane/fleet/operator.py",
    "controlplane/fleet/schema.py",
    "controlplane/fleet/snapshot.py",
    "controlplane/maglev.py",
    "controlplane/probe/budget.py",
    "controlplane/samples.py",
    "controlplane/weights.py",
    "controlplane/steadyrtt.py",
    "controlplane/wiresignals.py",
]

# Modules that reach the kernel, files, the network or other processes.
NOT_PURE = {
    "bcc",
    "pyroute2",
    "ctypes",
    "fcntl",
    "mmap",  # the kernel
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",  # files
    "socket",
    "select",
    "selectors",
    "ssl",
    "grpc",
    "http",
    "urllib",
    "dns",
    "aetcd",
    "scapy",  # the network
    "subprocess",
    "multiprocessing",  # other processes
}
# asyncio is allowed (events, locks, timeouts) but not its network calls.
ASYNCIO_NETWORK = {
    "open_connection",
    "start_server",
    "open_unix_connection",
    "start_unix_server",
    "create_connection",
    "create_server",
    "create_datagram_endpoint",
    "create_unix_connection",
    "create_unix_server",
    "sock_connect",
    "sock_accept",
    "sock_recv",
    "sock_recv_into",
    "sock_sendall",
    "sock_sendto",
    "sock_recvfrom",
    "subprocess_exec",
    "subprocess_shell",
    "create_subprocess_exec",
    "create_subprocess_shell",
}
# The files pure modules read: the config, by configkit.read_config_text (os.open with
# O_NONBLOCK, fstat, a size limit) for config.load_config; a service's token secret, by
# discovery.tokens.read_secret.
ALLOWED = {
    "controlplane/configkit.py": {"os"},
    "controlplane/config.py": {"os"},
    "controlplane/discovery/tokens.py": {"os"},
}
# edgectl drill failover runs its drill in a namespace lab by design (README: drill/run).
LAB_USERS = {"controlplane/drill/capture.py", "controlplane/drill/plan.py", "controlplane/drill/run.py"}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _package_of(path: str) -> list[str]:
    parts = path.removesuffix(".py").split("/")
    return parts[:-1]  # a module's package; for __init__, the package itself


def imports(source: str, path: str = "controlplane/x.py") -> set[str]:
    """Every module the source imports when it runs (dotted names; `from a import b` gives a
    and a.b, since b may be a module), anywhere but under `if TYPE_CHECKING:`."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(path)
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def asyncio_network_calls(source: str) -> set[str]:
    """asyncio's network and subprocess calls the source names (asyncio.x, loop.x, or imported)."""
    tree = ast.parse(source)
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asyncio")
        for alias in node.names
    }
    return names & ASYNCIO_NETWORK


@functools.cache
def imports_of(path: str) -> frozenset[str]:
    """imports() of a repository file."""
    return frozenset(imports((TOP / path).read_text(), path))


@functools.cache
def _python_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "*.py", "tools/bench-*"], cwd=TOP, capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted(p for p in listed if (TOP / p).is_file())


def _module_file(name: str) -> str | None:
    """The repository file of a controlplane module, or None (not ours, or an attribute)."""
    if name != "controlplane" and not name.startswith("controlplane."):
        return None
    rel = name.replace(".", "/")
    for candidate in (f"{rel}.py", f"{rel}/__init__.py"):
        if (TOP / candidate).is_file():
            return candidate
    return None


def _runs_with(path: str) -> set[str]:
    """path and every controlplane file that importing it runs: what it imports, their
    imports, and the packages' __init__ on the way."""
    seen: set[str] = set()
    todo = [path]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        parts = p.split("/")
        todo += [
            f"{'/'.join(parts[:i])}/__init__.py"
            for i in range(1, len(parts))
            if (TOP / "/".join(parts[:i]) / "__init__.py").is_file()
        ]
        for name in imports_of(p):
            f = _module_file(name)
            if f is not None:
                todo.append(f)
    return seen


def test_the_scanner_sees_imports_anywhere_but_under_type_checking():
    src = (
        "import os.path\nfrom . import sibling\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import bcc\nelse:\n    import json\n"
        "def f():\n    from pyroute2 import IPRoute\n"
    )
    got = imports(src, "controlplane/maps/x.py")
    assert {"os.path", "controlplane.maps", "controlplane.maps.sibling", "json", "pyroute2"} <= got
    assert "bcc" not in got
    assert asyncio_network_calls("import asyncio\nasync def f(loop):\n    await loop.create_connection()\n") == {
        "create_connection"
    }


def test_bcc_is_imported_only_by_the_loader():
    users = [p for p in _python_files() if any(n.split(".")[0] == "bcc" for n in imports_of(p))]
    assert users == ["controlplane/loader.py"]


@pytest.mark.parametrize("pure", PURE)
def test_a_pure_module_and_what_it_imports_reach_no_kernel_file_or_network(pure):
    found = {}
    for p in sorted(_runs_with(pure)):
        bad = {n.split(".")[0] for n in imports_of(p)} & NOT_PURE
        bad = (bad - ALLOWED.get(p, set())) | asyncio_network_calls((TOP / p).read_text())
        if bad:
            found[p] = sorted(bad)
    assert found == {}


def test_the_product_never_imports_the_lab():
    outside = ("controlplane/lab/", "controlplane/tests/", "tools/", "netns-tests/")
    users = {
        p
        for p in _python_files()
        if not p.startswith(outside)
        and any(n == "controlplane.lab" or n.startswith("controlplane.lab.") for n in imports_of(p))
    }
    assert users == LAB_USERS
