"""Which config this node runs, and the node settings edgectl takes from it.

edgectl reads the node's config by default: --config FILE, else $EDGE_CONFIG, else
/etc/edge/edge.yaml when it exists. Its node section gives pin_dir and api_socket (so a node
with a custom pin_dir is found without flags); --pin-dir and --socket, and $EDGE_PIN_DIR and
$EDGE_API_SOCKET, still win. Only the node section is checked here: status and undeploy must
keep working while the services of the file are being edited.
"""

from __future__ import annotations

import os

from controlplane.config import Node
from controlplane.configkit import _load_yaml, _parse, read_config_text
from controlplane.errors import ConfigError

DEFAULT_CONFIG = "/etc/edge/edge.yaml"
ENV_CONFIG = "EDGE_CONFIG"
ENV_PIN_DIR = "EDGE_PIN_DIR"
ENV_API_SOCKET = "EDGE_API_SOCKET"


def config_path(given: str | None, required: bool = False) -> str | None:
    """given, else $EDGE_CONFIG, else /etc/edge/edge.yaml when it exists; None when none
    is (ConfigError if required)."""
    if given:
        return given
    if os.environ.get(ENV_CONFIG):
        return os.environ[ENV_CONFIG]
    if os.path.exists(DEFAULT_CONFIG):
        return DEFAULT_CONFIG
    if required:
        raise ConfigError(f"config: none given (--config FILE, or {ENV_CONFIG}); {DEFAULT_CONFIG} does not exist")
    return None


def node_settings(path: str | None) -> Node:
    """The node section of the config at path (defaults without a file); ConfigError naming
    the file and the field."""
    if path is None:
        return Node()
    doc = _load_yaml(read_config_text(path), path)
    section = doc.get("node") if isinstance(doc, dict) else None
    try:
        return _parse(Node, section if section is not None else {}, "node")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _node(args) -> Node:
    if getattr(args, "_node", None) is None:
        args._node = node_settings(config_path(getattr(args, "config", None)))
    return args._node


def pin_dir(args) -> str:
    """--pin-dir, else $EDGE_PIN_DIR, else the node config's node.pin_dir."""
    return getattr(args, "pin_dir", None) or os.environ.get(ENV_PIN_DIR) or _node(args).pin_dir


def api_socket(args) -> str:
    """--socket, else $EDGE_API_SOCKET, else the node config's node.api_socket."""
    return getattr(args, "socket", None) or os.environ.get(ENV_API_SOCKET) or _node(args).api_socket
