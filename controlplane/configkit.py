"""How a config key is declared and checked: option() (a dataclass field
with its default, help and check), the value checks that turn a YAML value
into a field's value or raise a one-line ConfigError naming its path, the
machinery that parses a mapping into a dataclass, and reading YAML safely
(size-capped, never blocking, duplicate keys refused). config.py holds the
schema itself. Pure: no kernel, no network."""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from contextvars import ContextVar
from dataclasses import MISSING, field, fields
from ipaddress import IPv4Address, IPv6Address
from typing import Any, Callable

import yaml

from controlplane import limits
from controlplane.errors import ConfigError
from controlplane.maglev import is_prime

Check = Callable[[Any, str], Any]

MAX_MS = 3_600_000  # upper bound of every *_ms value: one hour
MAX_CONFIG_BYTES = 1 << 20  # a config file or text larger than this is refused unread
TOKEN_MAX = 2**128 - 1  # a heartbeat key: 128 bits (64-bit tokens of older configs stay valid)


def option(help: str, check: Check, default: Any = MISSING, required: bool | None = None) -> Any:
    """Declare a config key: help text, check(value, path) -> value, and its default.

    required: whether the YAML must give the key; by default, when it has no
    default. (A required key after optional ones keeps a dataclass default.)
    """
    metadata = {"help": help, "check": check, "required": default is MISSING if required is None else required}
    if default is MISSING:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


# ---- value checks: each takes (value, path) and returns the value to store ----


def _show(value: Any) -> str:
    """A value as an error message quotes it: short, one line, in YAML's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= 48 else text[:44] + "...'"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _kind(value: Any) -> str:
    """What a value is, without quoting it."""
    if isinstance(value, (list, tuple, dict)) or value is None:
        return _show(value)
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}.get(type(value), "a scalar")


def _join(path: str, key: Any) -> str:
    if not (isinstance(key, str) and _NAME.fullmatch(key)):
        key = _show(key)
    return f"{path}.{key}" if path else key


def _integer(value: Any, path: str) -> int:
    # bool is an int in Python, but `port: yes` is a mistake, not port 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}: expected an integer, got {_show(value)}")
    return int(value)


def _int(lo: int, hi: int, what: str | None = None) -> Check:
    """An integer in lo..hi; `what` names the kind in the error ("a port")."""

    def check(value: Any, path: str) -> int:
        number = _integer(value, path)
        if not lo <= number <= hi:
            problem = f"is not {what}" if what else f"is out of range {lo}..{hi}"
            raise ConfigError(f"{path}: {_show(number)} {problem}")
        return number

    return check


def _port(value: Any, path: str) -> int:
    number = _integer(value, path)
    if not limits.is_port(number):
        raise ConfigError(f"{path}: {_show(number)} is not a port")
    return number


def _weight(value: Any, path: str) -> int:
    number = _integer(value, path)
    if not limits.is_weight(number):
        raise ConfigError(f"{path}: {_show(number)} is out of range {limits.WEIGHTS}")
    return number


_ms = _int(1, MAX_MS)


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: expected true or false, got {_show(value)}")
    return value


def _one_of(*choices: str) -> Check:
    def check(value: Any, path: str) -> str:
        if not (isinstance(value, str) and value in choices):
            raise ConfigError(f"{path}: expected one of {', '.join(choices)}, got {_show(value)}")
        return str(value)

    return check


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{path}: expected a string, got {_show(value)}")
    return str(value)


_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,30}")  # the maps keep 31 bytes and a NUL


def _name(value: Any, path: str) -> str:
    name = _string(value, path)
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{path}: {_show(name)} is not a name (1 to 31 of a-z 0-9 _ . -, starting with a letter or digit)"
        )
    return name


def _abs_path(value: Any, path: str) -> str:
    text = _string(value, path)
    if not text.startswith("/") or "\0" in text:
        raise ConfigError(f"{path}: expected an absolute path, got {_show(text)}")
    return text


def _url_path(value: Any, path: str) -> str:
    text = _string(value, path)
    if not re.fullmatch(r"/[!-~]*", text):
        raise ConfigError(f"{path}: expected a URL path starting with '/', got {_show(text)}")
    return text


_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*)):(?P<port>[0-9]{1,5})")


def _ifname(value: Any, path: str) -> str:
    text = _string(value, path)
    if not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", text):
        raise ConfigError(f"{path}: {_show(text)} is not an interface name")
    return text


def _listen(value: Any, path: str) -> str:
    text = _string(value, path)
    match = _LISTEN.fullmatch(text)
    ok = match is not None and limits.is_port(int(match["port"]))
    if ok and match is not None and match["v6"]:
        try:
            ipaddress.IPv6Address(match["v6"])
        except ValueError:
            ok = False
    if not ok:
        raise ConfigError(f"{path}: expected HOST:PORT (e.g. 127.0.0.1:9470), got {_show(text)}")
    return text


_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")


def _group(value: Any, path: str) -> int | str:
    """A group name, or a numeric gid; whether it exists is checked where it is used."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _int(0, 2**32 - 2, "a group id")(value, path)
    text = _string(value, path)
    if not _GROUP.fullmatch(text):
        raise ConfigError(f"{path}: {_show(text)} is not a group name")
    return text


def _unicast(address: Any, path: str) -> Any:
    """address when it can be a VIP, a backend or a peer; else the one-line ConfigError naming what
    it is. The one home of that rule for both families (IPv6's link-local and IPv4-mapped addresses
    are refused too; IPv4's link-local ones are not)."""
    v6 = address.version == 6
    unusable = (
        (address.is_unspecified, "the unspecified address"),
        (address.is_loopback, "a loopback address"),
        (address.is_multicast, "a multicast address"),
        (v6 and address.is_link_local, "a link-local address"),
        (v6 and address.ipv4_mapped is not None, "an IPv4-mapped address (give the IPv4 address)"),
        (address.is_reserved, "a reserved address"),
    )
    for found, kind in unusable:
        if found:
            raise ConfigError(f"{path}: {address} is {kind}")
    return address


def _ipv4(role: str) -> Check:
    """A unicast IPv4 address; role names what it is for in the IPv6 error ("VIPs")."""

    def check(value: Any, path: str) -> IPv4Address:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected an IPv4 address, got {_show(value)}")
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            raise ConfigError(f"{path}: {_show(value)} is not an IPv4 address") from None
        if address.version == 6:
            raise ConfigError(f"{path}: IPv6 {role} are not supported yet")
        return _unicast(address, path)

    return check


def _ip(role: str) -> Check:
    """A unicast IPv4 or IPv6 address; role names what it is for ("VIPs")."""

    def check(value: Any, path: str) -> IPv4Address | IPv6Address:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected an IPv4 or IPv6 address, got {_show(value)}")
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            raise ConfigError(f"{path}: {_show(value)} is not an IPv4 or IPv6 address") from None
        if address.version == 4:
            return _ipv4(role)(value, path)
        return _unicast(address, path)

    return check


def _token(value: Any, path: str) -> int:
    if isinstance(value, str):
        try:
            number = int(value, 0)
        except ValueError:
            raise ConfigError(f"{path}: {_show(value)} is not an integer (e.g. 0x5eed0001)") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        number = int(value)
    else:
        raise ConfigError(f"{path}: expected an integer or a string like '0x5eed0001', got {_show(value)}")
    if not 0 <= number <= TOKEN_MAX:
        raise ConfigError(f"{path}: {_show(value)} is out of range 0..2**128-1")
    if number == 0:
        raise ConfigError(f"{path}: 0 is not a token (it is what an unset field holds); use a random 128-bit value")
    return number


def _maglev_m(value: Any, path: str) -> int:
    m = _int(1009, 1_000_003)(value, path)
    if not is_prime(m):
        raise ConfigError(f"{path}: {m} is not prime")
    return m


def _version(value: Any, path: str) -> int:
    version = _integer(value, path)
    if version != 1:
        raise ConfigError(f"{path}: {_show(version)} is not supported (expected 1)")
    return version


# ---- sections: a dataclass is the schema of one YAML mapping ----


# While collect_errors() runs, every ConfigError of a field is noted here and parsing goes
# on with the next field; a section with errors then raises _Reported, which its parents
# note no more. Otherwise (the default, None) the first error is raised as it is.
_COLLECT: ContextVar[list[str] | None] = ContextVar("config_errors", default=None)


class _Reported(ConfigError):
    """A section whose errors are noted already (collect_errors)."""


def _note(e: ConfigError) -> bool:
    """Raises e, or while collecting notes it (unless noted already) and returns True."""
    sink = _COLLECT.get()
    if sink is None:
        raise e
    if not isinstance(e, _Reported):
        sink.append(str(e))
    return True


def _unknown_key(options: tuple, key: Any, path: str) -> ConfigError:
    allowed = ", ".join(f.name for f in options)
    if not path and isinstance(key, str) and not _NAME.fullmatch(key):
        # A file that is no config (a path mistyped, a file swapped) starts here:
        # quoting its first line could show what it holds.
        return ConfigError(f"config: a top-level key that is not a name; unknown key (allowed: {allowed})")
    return ConfigError(f"{_join(path, key)}: unknown key (allowed: {allowed})")


def _parse(cls: type, value: Any, path: str) -> Any:
    """Build cls from the mapping at path: keys, then each field's check, then cls._validate."""
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a mapping, got {_show(value)}")
    options = fields(cls)
    names = {f.name for f in options}
    failed = False
    for key in value:
        if not (isinstance(key, str) and key in names):
            failed = _note(_unknown_key(options, key, path))
    values = {}
    for f in options:
        where = _join(path, f.name)
        try:
            if f.name in value:
                values[f.name] = f.metadata["check"](value[f.name], where)
            elif f.metadata["required"]:
                raise ConfigError(f"{where}: missing")
        except ConfigError as e:
            failed = _note(e)
    if failed:
        raise _Reported(path or "config")
    built = cls(**values)
    validate = getattr(built, "_validate", None)
    if validate is not None:
        validate(path)
    return built


def collect_errors(parse: Callable[[], Any]) -> list[str]:
    """Every error parse() (a parse_config call) meets, one line each, instead of the first:
    each field's own, and the checks across fields of every section whose fields are valid."""
    sink: list[str] = []
    token = _COLLECT.set(sink)
    try:
        parse()
    except _Reported:
        pass
    except ConfigError as e:
        sink.append(str(e))
    finally:
        _COLLECT.reset(token)
    return sink


def _section(cls: type) -> Check:
    return lambda value, path: _parse(cls, value, path)


def _sections(cls: type, empty: bool = False) -> Check:
    """A list of cls mappings (non-empty unless empty is true), as a tuple."""

    def check(value: Any, path: str) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {_show(value)}")
        if not value and not empty:
            raise ConfigError(f"{path}: must not be empty")
        items, failed = [], False
        for i, item in enumerate(value):
            try:
                items.append(_parse(cls, item, f"{path}[{i}]"))
            except ConfigError as e:
                failed = _note(e)
        if failed:
            raise _Reported(path)
        return tuple(items)

    return check


def _longer_than_interval(section: Any, path: str, key: str) -> None:
    """ConfigError unless section.<key> exceeds section.interval_ms."""
    value, interval = getattr(section, key), section.interval_ms
    if value <= interval:
        raise ConfigError(f"{path}.{key}: {value} must be greater than interval_ms ({interval})")


def _dns_name(value: Any, path: str) -> str:
    name = _string(value, path)
    labels = name.rstrip(".").split(".")
    if not (
        0 < len(name) <= 253
        and all(re.fullmatch(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?", x) for x in labels)
    ):
        raise ConfigError(f"{path}: {_show(name)} is not a DNS name")
    return name


def _server(value: Any, path: str) -> tuple[str, int]:
    """HOST:PORT with an IPv4 host, or a bare IPv4 address (port 53)."""
    text = _string(value, path)
    host, _, port = text.partition(":")
    try:
        address = ipaddress.IPv4Address(host)
        number = int(port) if port else 53
    except ValueError:
        raise ConfigError(f"{path}: expected IPv4[:PORT] (e.g. 127.0.0.1:53), got {_show(text)}") from None
    if not limits.is_port(number):
        raise ConfigError(f"{path}: {number} is not a port")
    return (str(address), number)


def _list_of(check: Check, empty: bool = True) -> Check:
    def checked(value: Any, path: str) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {_show(value)}")
        if not value and not empty:
            raise ConfigError(f"{path}: must not be empty")
        return tuple(check(item, f"{path}[{i}]") for i, item in enumerate(value))

    return checked


def _etcd_prefix(value: Any, path: str) -> str:
    text = _string(value, path)
    if not text.startswith("/") or not text.endswith("/") or len(text) < 2:
        raise ConfigError(f"{path}: expected a key prefix like '/edge/services/chat/', got {_show(text)}")
    return text


# ---- YAML ----


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping instead of keeping the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = e.problem or e.context or "invalid YAML"
        if e.problem and e.context and not e.context.startswith("while "):
            problem = f"{e.context}, {e.problem}"  # "expected a single document ..., but found another"
        raise ConfigError(f"config: {source}{where}: {problem}") from e
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        character = e.character if isinstance(e.character, int) else ord(e.character)
        raise ConfigError(f"config: {source} line {line}: unacceptable character #x{character:04x}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"config: {source}: {e}") from e
    except ValueError as e:
        # PyYAML calls int() and datetime() on scalars without catching: an integer
        # literal over Python's digit limit (3.11+) or a date like 2024-13-01.
        raise ConfigError(f"config: {source}: {e}") from e
    except RecursionError as e:
        # PyYAML composes nested collections recursively.
        raise ConfigError(f"config: {source}: nested too deeply") from e


def _too_big(size: int, what: str) -> ConfigError:
    return ConfigError(f"{what}: {size} bytes, more than the {MAX_CONFIG_BYTES} a config may have")


def read_config_text(path: str | os.PathLike) -> str:
    """The text of the config file at path: a regular file of at most MAX_CONFIG_BYTES.
    Never blocks: a FIFO or a device in its place is refused before any read."""
    source = os.fsdecode(path)
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"config: cannot read {source}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"config: {source} is not a regular file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise _too_big(st.st_size, f"config: {source}")
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:  # the file may grow after fstat
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_CONFIG_BYTES:
            raise _too_big(size, f"config: {source}")
    except OSError as e:
        raise ConfigError(f"config: cannot read {source}: {e.strerror or e}") from e
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config: cannot read {source}: not UTF-8 (byte {e.start})") from e
