"""What a backend needs for direct server return (a service's forwarding: dsr), checked and set up.

The router sends each packet to the backend in IPIP, the VIP kept as the inner destination; the
backend answers the client directly from the VIP. So the backend needs:

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

problems() is pure (a State in, the first missing thing as one line out); read_state() and setup()
touch the system, through `ip` and /proc/sys. Used by tools/dsr-backend and edge-heartbeat --dsr-vip.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

DECAP = "tunl0"
DECAP_PROG = "dsr_decap"  # bpf/dsr_decap.c
DECAP_SOURCE = Path(__file__).resolve().parents[2] / "bpf" / "dsr_decap.c"
ENCAP_OVERHEAD = 20
TCP_IP_HEADERS = 40


@dataclass(frozen=True)
class State:
    """What the checks look at, read from the system (read_state) or made up (tests)."""

    decap_up: bool  # tunl0 up, or dsr_decap attached (XDP) to the default route's device
    lo_addrs: frozenset[IPv4Address]
    arp_ignore: int
    arp_announce: int
    rp_filter_all: int
    rp_filter_decap: int
    link_mtu: int | None  # of the default route's device; None: no default route
    advmss: int | None  # of the default route; None: not set


def wanted_advmss(link_mtu: int) -> int:
    return link_mtu - TCP_IP_HEADERS - ENCAP_OVERHEAD


def problems(state: State, vip: IPv4Address) -> str | None:
    """The first thing missing for direct server return of vip, as one line; None when all is there."""
    if not state.decap_up:
        return (
            f"decap: neither {DECAP} up (modprobe ipip; ip link set {DECAP} up) nor {DECAP_PROG} "
            "attached to the default route's device (tools/dsr-backend setup --decap xdp)"
        )
    if vip not in state.lo_addrs:
        return f"vip: {vip} is not on lo (ip addr add {vip}/32 dev lo)"
    if state.arp_ignore != 1 or state.arp_announce != 2:
        return (
            f"arp: net.ipv4.conf.all.arp_ignore is {state.arp_ignore} and arp_announce "
            f"{state.arp_announce}; want 1 and 2"
        )
    if max(state.rp_filter_all, state.rp_filter_decap) != 0:
        return f"rp_filter: net.ipv4.conf.all and {DECAP}.rp_filter must be 0"
    if state.link_mtu is not None and (state.advmss is None or state.advmss > wanted_advmss(state.link_mtu)):
        return (
            f"advmss: the default route's is {state.advmss or 'unset'}; want at most "
            f"{wanted_advmss(state.link_mtu)} (link MTU {state.link_mtu} - 60)"
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


def _default_route() -> dict | None:
    routes = _ip("route", "show", "default")
    return routes[0] if routes else None


def read_state() -> State:
    links = {link["ifname"]: link for link in _ip("link", "show")}
    decap = links.get(DECAP)
    lo_addrs = frozenset(
        IPv4Address(a["local"]) for entry in _ip("-4", "addr", "show", "dev", "lo") for a in entry.get("addr_info", [])
    )
    route = _default_route()
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
        rp_filter_decap=_sysctl(f"net.ipv4.conf.{DECAP}.rp_filter") if decap else 0,
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


def setup(vip: IPv4Address, decap: str = "tunl0") -> None:
    """Make read_state() satisfy problems() for vip: idempotent. decap: tunl0 or xdp."""
    route = _default_route()
    if decap == "xdp":
        if route is None:
            raise OSError("decap xdp: no default route, so no device to attach to")
        attach_decap(route["dev"])
    else:
        if not Path("/sys/class/net", DECAP).exists():
            subprocess.run(["modprobe", "ipip"], check=True, timeout=30.0)
        subprocess.run(["ip", "link", "set", DECAP, "up"], check=True, timeout=10.0)
    if vip not in read_state().lo_addrs:
        subprocess.run(["ip", "addr", "add", f"{vip}/32", "dev", "lo"], check=True, timeout=10.0)
    _sysctl("net.ipv4.conf.all.arp_ignore", 1)
    _sysctl("net.ipv4.conf.all.arp_announce", 2)
    _sysctl("net.ipv4.conf.all.rp_filter", 0)
    if Path("/sys/class/net", DECAP).exists():
        _sysctl(f"net.ipv4.conf.{DECAP}.rp_filter", 0)
    mtu = read_state().link_mtu
    if route is not None and mtu is not None:
        via = ["via", route["gateway"]] if route.get("gateway") else []
        subprocess.run(
            ["ip", "route", "change", "default", *via, "dev", route["dev"], "advmss", str(wanted_advmss(mtu))],
            check=True,
            timeout=10.0,
        )
