"""The control plane's exceptions: EdgeError and one subclass per boundary.

Every message is one line that carries its own context (a config path, an
interface, a map name), so edgectl can print `edgectl: <message>` as it is.
Raising and catching stay with the modules; this file defines the types and
say(), the one way a command prints an error.
"""

from __future__ import annotations

import sys
import traceback


class EdgeError(Exception):
    """Base of every error edgectl reports as one line."""

    def __init__(self, message: str) -> None:
        # One line by construction: text quoted from outside (YAML, bcc, netlink)
        # may carry line breaks of its own.
        lines = (line.strip() for line in str(message).splitlines())
        super().__init__(" ".join(line for line in lines if line))

    @property
    def message(self) -> str:
        return str(self)


class HostError(EdgeError):
    """The host lacks what the operation needs: privileges, a kernel feature or its headers,
    a bpffs, a running edged. edgectl exits 3 on it (1 is for a refused config or input)."""


class ConfigError(EdgeError):
    """The config file is unreadable or invalid; the message names the field path."""


class LoaderError(EdgeError):
    """Compiling, loading, attaching or pinning the BPF programs failed."""


class CompileError(LoaderError, HostError):
    """The data path does not compile on this kernel (its headers are missing, or it changed)."""


class MapError(EdgeError):
    """Reading or writing a BPF map failed; map names it when one map is to blame."""

    def __init__(self, message: str, map: str | None = None) -> None:
        super().__init__(message)
        self.map = map


class Cancelled(EdgeError):
    """The work was stopped from outside before it was done (a SIGTERM during edged's start
    ends the compile); what it had changed is rolled back."""


class NotDeployed(EdgeError):
    """Nothing is deployed where the operation expected a deployed router."""


class ApiError(EdgeError):
    """edged's API refused a request or could not be reached; code is the gRPC status name."""

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class ApiDenied(ApiError, HostError):
    """The API socket is closed to this user (not root, not in node.api_group)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "UNAVAILABLE")


class NotRunning(ApiError, HostError):
    """No edged answers where the API should be (socket missing, or nothing listening)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "UNAVAILABLE")


class NoBpffs(LoaderError, HostError):
    """node.pin_dir lies on no bpffs this process sees."""


class SpeakerError(EdgeError):
    """The BGP speaker (bird) did not start, refused its config or cannot be reached."""


def say(prog: str, text: object, debug: bool = False) -> None:
    """An error as every command reports it: one line `prog: text` on stderr, and with
    --debug the traceback of the exception being handled first."""
    if debug:
        traceback.print_exc()
    print(f"{prog}: {text}", file=sys.stderr)
