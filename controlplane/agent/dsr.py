"""What a backend needs for direct server return (a service's forwarding: dsr), checked and set up.

The router sends each packet to the backend in IPIP (an IPv4 VIP) or IPv6-in-IPv6 (an IPv6 VIP),
the VIP kept as the inner destination; the backend answers the client directly from the VIP. So
the backend needs, for an IPv4 VIP:

  decap      an IPIP device up that takes packets from any router: the kernel's catch-all tunl0
             (module ipip), up; or, where the kernel has no ipip, bpf/dsr_decap.c as XDP on the
             default route's device (setup --decap xdp; needs bcc, as the router does);
  vip        the VIP on lo (/32), so the decapsulated packets are local and replies leave from it;
  arp        arp_ignore 1 and arp_announce 2 (net.ipv4.conf.all), so the backend neither answers ARP
             for the VIP on its links nor announces it: the VIP stays the router's;
  rp_filter  0 on tunl0 and all (the effective value is the larger): a decapsulated packet comes
             from a client the backend routes elsewhere;
  advmss     on the default route, the link MTU - 60 (40 for IPv4 and TCP, 20 for the outer header),
             so clients send segments that still fit the backend's link once encapsulated.

and for an IPv6 VIP:

  decap      the kernel's catch-all ip6tnl0 (module ip6_tunnel) up, or bpf/dsr_decap.c (which
             takes both) as XDP on the IPv6 default route's device;
  vip        the VIP on lo (/128);
  advmss     on the IPv6 default route, the link MTU - 100 (60 for IPv6 and TCP, 40 for the outer
             header).

IPv6 needs nothing for arp and rp_filter: the kernel answers a neighbour solicitation only for an
address of the interface it arrived on (a VIP on lo is not announced on the backend's links unless
proxy_ndp is set), and IPv6 has no rp_filter.

problems() is pure (a State in, the first missing thing as one line out); read_state() and setup()
touch the system, through `ip` and /proc/sys. Used by tools/dsr-backend and edge-heartbeat --dsr-vip.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path

DECAP = "tunl0"
DECAP6 = "ip6tnl0"
DECAP_MODULE = {DECAP: "ipip", DECAP6: "ip6_tunnel"}
DECAP_PROG = "dsr_decap"  # bpf/dsr_decap.c
DECAP_SOURCE = Path(__file__).resolve().parents[2] / "bpf" / "dsr_decap.c"
ENCAP_OVERHEAD = {4: 20, 6: 40}
TCP_IP_HEADERS = {4: 40, 6: 60}


@dataclass(frozen=True)
class State:
    """What the checks look at, read from the system (read_state) or made up (tests). The decap and
    route fields are those of one family, the VIP's (read_state's family)."""

    decap_up: bool  # tunl0 (ip6tnl0) up, or dsr_decap attached (XDP) to the default route's device
    lo_addrs: frozenset[IPv4Address | IPv6Address]
    arp_ignore: int
    arp_announce: int
    rp_filter_all: int
    rp_filter_decap: int
    link_mtu: int | None  # of the default route's device; None: no default route
    advmss: int | None  # of the default route; None: not set


def wanted_advmss(link_mtu: int, family: int = 4) -> int:
    return link_mtu - TCP_IP_HEADERS[family] - ENCAP_OVERHEAD[family]


def decap_device(family: int) -> str:
    return DECAP if family == 4 else DECAP6


def problems(state: State, vip: IPv4Address | IPv6Address) -> str | None:
    """The first thing missing for direct server return of vip, as one line; None when all is there."""
    family, dev = vip.version, decap_device(vip.version)
    route = "default route" if family == 4 else "IPv6 default route"
    if not state.decap_up:
        return (
            f"decap: neither {dev} up (modprobe {DECAP_MODULE[dev]}; ip link set {dev} up) nor {DECAP_PROG} "
            f"attached to the {route}'s device (tools/dsr-backend setup --decap xdp)"
        )
    if vip not in state.lo_addrs:
        return f"vip: {vip} is not on lo (ip addr add {vip}/{vip.max_prefixlen} dev lo)"
    if family == 4 and (state.arp_ignore != 1 or state.arp_announce != 2):
        return (
            f"arp: net.ipv4.conf.all.arp_ignore is {state.arp_ignore} and arp_announce "
            f"{state.arp_announce}; want 1 and 2"
        )
    if family == 4 and max(state.rp_filter_all, state.rp_filter_decap) != 0:
        return f"rp_filter: net.ipv4.conf.all and {DECAP}.rp_filter must be 0"
    want = wanted_advmss(state.link_mtu, family) if state.link_mtu is not None else None
    if want is not None and (state.advmss is None or state.advmss > want):
        return (
            f"advmss: the {route}'s is {state.advmss or 'unset'}; want at most {want} "
            f"(link MTU {state.link_mtu} - {TCP_IP_HEADERS[family] + ENCAP_OVERHEAD[family]})"
        )
    return None


def _sysctl(key: str, value: object | None = None) -> int:
    path = Path("/proc/sys", *key.split("."))
    if value is not None:
        path.write_text(f"{value}\n")
    try:
        return int(path.read_text().strip())
    except FileNotFoundError:
        return -1


def _ip(*args: str) -> list[dict]:
    done = subprocess.run(["ip", "-j", "-d", *args], capture_output=True, text=True, timeout=10.0, check=True)
    return json.loads(done.stdout or "[]")


def _default_route(family: int = 4) -> dict | None:
    routes = _ip(f"-{family}", "route", "show", "default")
    return routes[0] if routes else None


def read_state(family: int = 4) -> State:
    """The backend's state for direct server return of a VIP of family (4 or 6)."""
    links = {link["ifname"]: link for link in _ip("link", "show")}
    decap = links.get(decap_device(family))
    lo_addrs = frozenset(
        ip_address(a["local"])
        for entry in _ip(f"-{family}", "addr", "show", "dev", "lo")
        for a in entry.get("addr_info", [])
    )
    route = _default_route(family)
    link_mtu = advmss = None
    if route is not None:
        link_mtu = links.get(route.get("dev"), {}).get("mtu")
        for metric in route.get("metrics", []):
            if isinstance(metric, dict) and "advmss" in metric:
                advmss = int(metric["advmss"])
    dev = links.get(route.get("dev"), {}) if route else {}
    xdp_name = dev.get("xdp", {}).get("prog", {}).get("name", "")
    return State(
        decap_up=(decap is not None and "UP" in decap.get("flags", [])) or xdp_name == DECAP_PROG,
        lo_addrs=lo_addrs,
        arp_ignore=_sysctl("net.ipv4.conf.all.arp_ignore"),
        arp_announce=_sysctl("net.ipv4.conf.all.arp_announce"),
        rp_filter_all=_sysctl("net.ipv4.conf.all.rp_filter"),
        rp_filter_decap=_sysctl(f"net.ipv4.conf.{DECAP}.rp_filter") if family == 4 and decap else 0,
        link_mtu=link_mtu,
        advmss=advmss,
    )


def attach_decap(ifname: str) -> None:
    """bpf/dsr_decap.c as XDP (native) on ifname; it stays attached after this process ends."""
    from controlplane import loader

    prog = loader.compile_standalone(DECAP_SOURCE)
    try:
        loader.attach_xdp(ifname, prog.load(DECAP_PROG, "xdp"), "native", replace=True)
    finally:
        prog.close()


def setup(vip: IPv4Address | IPv6Address, decap: str | None = None) -> None:
    """Make read_state(vip.version) satisfy problems() for vip: idempotent. decap: the family's
    kernel device (tunl0, ip6tnl0; the default) or xdp."""
    family = vip.version
    route = _default_route(family)
    dev = decap_device(family)
    if decap == "xdp":
        if route is None:
            raise OSError(f"decap xdp: no IPv{family} default route, so no device to attach to")
        attach_decap(route["dev"])
    elif decap in (None, dev):
        if not Path("/sys/class/net", dev).exists():
            subprocess.run(["modprobe", DECAP_MODULE[dev]], check=True, timeout=30.0)
        subprocess.run(["ip", "link", "set", dev, "up"], check=True, timeout=10.0)
    else:
        raise OSError(f"decap {decap}: not for an IPv{family} VIP (use {dev} or xdp)")
    if vip not in read_state(family).lo_addrs:
        subprocess.run(["ip", "addr", "add", f"{vip}/{vip.max_prefixlen}", "dev", "lo"], check=True, timeout=10.0)
    if family == 4:
        _sysctl("net.ipv4.conf.all.arp_ignore", 1)
        _sysctl("net.ipv4.conf.all.arp_announce", 2)
        _sysctl("net.ipv4.conf.all.rp_filter", 0)
        if Path("/sys/class/net", DECAP).exists():
            _sysctl(f"net.ipv4.conf.{DECAP}.rp_filter", 0)
    mtu = read_state(family).link_mtu
    if route is not None and mtu is not None:
        via = ["via", route["gateway"]] if route.get("gateway") else []
        subprocess.run(
            ["ip", f"-{family}", "route", "change", "default", *via, "dev", route["dev"], "advmss"]
            + [str(wanted_advmss(mtu, family))],
            check=True,
            timeout=10.0,
        )
