"""Interfaces, routes, the return path's tc filter and the one sysctl the
router touches, through pyroute2's netlink: nothing here imports bcc or
decides anything. Errors become LoaderError naming the interface; every step
that changes the node pushes its undo onto the caller's Undo. pyroute2 comes in without its
package __init__ (_without_package_init), which imports every netlink family it knows."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from controlplane.errors import LoaderError


def _without_package_init(name: str) -> None:
    """Registers package name with its path alone, so its submodules import without the
    package's __init__ running first; the first name asked of the package that is not a
    submodule (`from pyroute2 import NetNS`, as the lab does) runs that __init__ then. pyroute2's __init__
    imports every family it knows (ndb with sqlite3, ipdb, ipvs, wireguard, nl80211, plan9, ...):
    9 MB of edged's RSS, which needs IPRoute and NetlinkError alone (tools/bench-rss)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    module = importlib.util.module_from_spec(spec)

    def complete(attr: str):
        if not attr.startswith("__") and importlib.util.find_spec(f"{name}.{attr}") is not None:
            return importlib.import_module(f"{name}.{attr}")  # a submodule (`from pyroute2 import config`)
        del module.__dict__["__getattr__"]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return getattr(module, attr)

    module.__dict__["__getattr__"] = complete
    sys.modules[name] = module


_without_package_init("pyroute2")
from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402

TC_INGRESS_PARENT = "ffff:fff2"
TC_PRIO = 0xED  # our filter's priority on clsact ingress; identifies it
TC_HANDLE = 1


def _ipr():
    from pyroute2.iproute import IPRoute

    return IPRoute()


def ifindex(name: str) -> int:
    """ifindex of an interface in this network namespace, or LoaderError."""
    with _ipr() as ipr:
        found = ipr.link_lookup(ifname=name)
    if not found:
        raise LoaderError(f"interface {name}: no such interface in this network namespace")
    return found[0]


def ifindexes() -> list[int]:
    """Every interface of this network namespace."""
    with _ipr() as ipr:
        return [link["index"] for link in ipr.get_links()]


def ifname(index: int) -> str:
    with _ipr() as ipr:
        try:
            return ipr.get_links(index)[0].get_attr("IFLA_IFNAME")
        except NetlinkError as e:
            if e.code == errno.ENODEV:
                return f"ifindex {index}"
            raise


def route_oif(address: str) -> int | None:
    """Egress ifindex of this namespace's route to address; None if unrouted."""
    return route_oifs([address])[address]


def route_oifs(addresses: Iterable[str]) -> dict[str, int | None]:
    """route_oif of every address over one netlink socket (opening one per address cost
    about 1.6 ms of CPU each: 1.6 s for 1,000 backends)."""
    out: dict[str, int | None] = {}
    with _ipr() as ipr:
        for address in addresses:
            if address in out:
                continue
            try:
                routes = ipr.route("get", dst=address)
            except NetlinkError as e:
                if e.code in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EINVAL):
                    out[address] = None
                    continue
                raise
            out[address] = _oif(routes)
    return out


def local_of(addresses: Iterable[str]) -> set[str]:
    """Those of addresses that this namespace routes as local (its own addresses, routes of
    type local), over one netlink socket; an unroutable address is not local."""
    out = set()
    with _ipr() as ipr:
        for address in set(addresses):
            try:
                routes = ipr.route("get", dst=address)
            except NetlinkError as e:
                if e.code in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EINVAL):
                    continue
                raise
            if any(r.get_attr("RTA_TYPE", r["type"]) == 2 for r in routes):  # RTN_LOCAL
                out.add(address)
    return out


def _oif(routes) -> int | None:
    for route in routes:
        if route.get_attr("RTA_TYPE", route["type"]) not in (1, 2):  # unicast, local
            return None
        oif = route.get_attr("RTA_OIF")
        if oif:
            return oif
    return None


@dataclass(frozen=True)
class XdpState:
    prog_id: int
    name: str
    mode: str  # native | generic | offload


def xdp_state(index: int) -> XdpState | None:
    """The XDP program attached to an interface, if any (None when the interface is gone)."""
    with _ipr() as ipr:
        try:
            link = ipr.get_links(index)[0]
        except NetlinkError as e:
            if e.code == errno.ENODEV:
                return None
            raise
    xdp = link.get_attr("IFLA_XDP")
    if not xdp:
        return None
    prog_id = xdp.get_attr("IFLA_XDP_PROG_ID")
    if not prog_id:
        return None
    attached = xdp.get_attr("IFLA_XDP_ATTACHED")
    # pyroute2 decodes the attach mode to a name; older versions give the number
    mode = {
        1: "native",
        2: "generic",
        3: "offload",
        "xdp": "native",
        "xdpgeneric": "generic",
        "xdpoffload": "offload",
    }.get(attached, "multi")
    return XdpState(prog_id, prog_name(prog_id), mode)


def prog_name(prog_id: int) -> str:
    out = subprocess.run(["bpftool", "-j", "prog", "show", "id", str(prog_id)], capture_output=True, text=True)
    if out.returncode != 0:
        return "?"
    return json.loads(out.stdout).get("name", "?")


def set_xdp(index: int, fd: int, flags: int) -> None:
    """Attaches the XDP program of fd to interface index with XDP_FLAGS_* flags (RTM_SETLINK with
    IFLA_XDP, as libbpf does); fd -1 detaches what flags' mode holds. LoaderError with the
    kernel's words (its extended ack when it gives one)."""
    attrs = [("IFLA_XDP_FD", fd)] + ([("IFLA_XDP_FLAGS", flags)] if flags else [])
    with _ipr() as ipr:
        try:
            ipr.link("set", index=index, xdp={"attrs": attrs})
        except NetlinkError as e:
            said = e.args[1] if len(e.args) > 1 and e.args[1] else ""
            text = os.strerror(e.code)
            raise LoaderError(f"{text} ({said})" if said and said != text else text) from e


def has_clsact(index: int) -> bool:
    with _ipr() as ipr:
        return any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index))


def return_filter(index: int) -> str | None:
    """Name of the program in our return-path filter slot, if one is there."""
    with _ipr() as ipr:
        filters = ipr.get_filters(index=index, parent=TC_INGRESS_PARENT)
    for f in filters:
        if f.get_attr("TCA_KIND") != "bpf" or (f["info"] >> 16) != TC_PRIO:
            continue
        opts = f.get_attr("TCA_OPTIONS")
        if opts is not None:
            return opts.get_attr("TCA_BPF_NAME") or "?"
    return None


def attach_tc(index: int, fn, undo) -> bool:
    """Puts the return-path program on clsact ingress of index (replacing
    ours if present). Returns whether clsact had to be added."""
    added = False
    with _ipr() as ipr:
        try:
            if not has_clsact(index):
                ipr.tc("add", "clsact", index)
                added = True
                undo.push(f"remove clsact from ifindex {index}", lambda: _del_clsact(index))
            had = return_filter(index) is not None
            ipr.tc(
                "replace-filter",
                "bpf",
                index,
                TC_HANDLE,
                fd=fn.fd,
                name=fn.name,
                parent=TC_INGRESS_PARENT,
                prio=TC_PRIO,
                classid=1,
                direct_action=True,
            )
            if not had:
                undo.push(f"remove return filter from ifindex {index}", lambda: detach_tc(index))
        except NetlinkError as e:
            raise LoaderError(f"attach tc on {ifname(index)}: {os.strerror(e.code)}") from e
    return added


def detach_tc(index: int, remove_clsact: bool = False) -> None:
    with _ipr() as ipr:
        try:
            if return_filter(index) is not None:
                ipr.tc("del-filter", "bpf", index, TC_HANDLE, parent=TC_INGRESS_PARENT, prio=TC_PRIO)
        except NetlinkError as e:
            if e.code not in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
                raise
    if remove_clsact:
        _del_clsact(index)


def _del_clsact(index: int) -> None:
    with _ipr() as ipr:
        try:
            ipr.tc("del", "clsact", index)
        except NetlinkError as e:
            if e.code not in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
                raise


# ---------------------------------------------------------------- sysctl

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
IPV6_FORWARDING = Path("/proc/sys/net/ipv6/conf/all/forwarding")


def ip_forward() -> int:
    return int(IP_FORWARD.read_text().strip())


def ipv6_forwarding() -> int:
    """net.ipv6.conf.all.forwarding; 0 without IPv6."""
    try:
        return int(IPV6_FORWARDING.read_text().strip())
    except FileNotFoundError:
        return 0


def set_ip_forward(value: int) -> None:
    IP_FORWARD.write_text(f"{value}\n")
