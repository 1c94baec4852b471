"""edgectl's exit codes, and which failure gets which. Pure: exceptions in, numbers out.

0  ok
1  refused: a bad config or input (the message names the field or the argument)
2  usage: the command line itself is wrong (argparse's own code)
3  environment: this host lacks what the command needs (root or the API group, a
   kernel feature or its headers, a bpffs, a running edged)
4  internal: a bug; run again with --debug and report the traceback
"""

from __future__ import annotations

import errno

from controlplane.errors import EdgeError, HostError

OK, REFUSED, USAGE, HOST, INTERNAL = 0, 1, 2, 3, 4
INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

HELP = """exit codes:
  0  ok
  1  refused: bad config or input (the message names the field)
  2  usage: wrong command line
  3  environment: needs root or the API group, a kernel feature or headers, a bpffs, a running edged
  4  internal error (run with --debug and report it)"""


class UsageError(EdgeError):
    """A command line argparse accepted but the command cannot use (exit 2)."""


NEEDS_ROOT = (
    "edgectl needs root for the data path (bpffs, netlink, /run/edge); "
    "commands edged serves also work for members of node.api_group"
)


def classify(exc: BaseException) -> tuple[int, str]:
    """(exit code, the one line to print after 'edgectl: ') for what a command raised."""
    if isinstance(exc, UsageError):
        return USAGE, str(exc)
    if isinstance(exc, HostError):
        return HOST, str(exc)
    if isinstance(exc, EdgeError):
        return REFUSED, str(exc)
    if isinstance(exc, PermissionError) or (isinstance(exc, OSError) and exc.errno in (errno.EPERM, errno.EACCES)):
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        return HOST, f"{where}permission denied: {NEEDS_ROOT}"
    return INTERNAL, f"internal error: {type(exc).__name__}: {exc} (run with --debug for details)"
