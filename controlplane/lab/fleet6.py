"""IPv6 in the ECMP fleet (fleet.py, FleetTopo(ipv6=True)): the same links with addresses from
2001:2::/48 beside the IPv4 ones, an IPv6 BGP session per router (its ipv6 channel carries the
IPv6 VIP), the upstream's ipv6 kernel routes with ECMP, backends that serve on both families and
send IPv6 replies back through the router the request came from, as IPv4 does.

Addresses: client 2001:2::2/64, upstream 2001:2::1/64 on its side; router i 2001:2:0:{20+i}::2/64
towards the upstream (::1 there); the backend LAN 2001:2:0:40::/64 with router i at ::{1+i} and
backend j at ::1:{j}. The IPv6 VIP is 2001:2:0:ffff::1. Owns only adding these to a FleetNet
being built; the namespaces, links and their removal are fleet.py's.
"""

from __future__ import annotations

from ipaddress import IPv6Address, IPv6Interface
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.lab.fleet import FleetNet

VIP6 = IPv6Address("2001:2:0:ffff::1")
CLIENT6 = IPv6Interface("2001:2::2/64")
UPSTREAM_CLIENT6 = IPv6Interface("2001:2::1/64")


def upstream_addr6(i: int) -> IPv6Interface:
    return IPv6Interface(f"2001:2:0:{0x20 + i:x}::1/64")


def router_up_addr6(i: int) -> IPv6Interface:
    return IPv6Interface(f"2001:2:0:{0x20 + i:x}::2/64")


def router_lan_addr6(i: int) -> IPv6Interface:
    return IPv6Interface(f"2001:2:0:40::{1 + i:x}/64")


def backend_addr6(j: int) -> IPv6Interface:
    return IPv6Interface(f"2001:2:0:40::1:{j:x}/64")


def build6(net: "FleetNet") -> None:
    """IPv6 addresses, forwarding, routes and the backends' return path on a FleetNet's links."""
    from controlplane.lab.fleet import CLIENT, LAN_TABLE_BASE, SWITCH, UPSTREAM

    topo = net.topo
    net.upstream.sysctl("net.ipv6.conf.all.forwarding", 1)
    net.upstream.sysctl("net.ipv6.fib_multipath_hash_policy", 1)
    for i in range(topo.routers):
        net.router(i).sysctl("net.ipv6.conf.all.forwarding", 1)

    def addr(role: str, there: str, address: IPv6Interface) -> None:
        net.ns[role].run(["ip", "-6", "addr", "add", str(address), "dev", net.ifname(role, there), "nodad"])

    addr(CLIENT, UPSTREAM, CLIENT6)
    addr(UPSTREAM, CLIENT, UPSTREAM_CLIENT6)
    for i in range(topo.routers):
        addr(UPSTREAM, f"r{i}", upstream_addr6(i))
        addr(f"r{i}", UPSTREAM, router_up_addr6(i))
        addr(f"r{i}", SWITCH, router_lan_addr6(i))
        net.router(i).run(["ip", "-6", "route", "add", "default", "via", str(upstream_addr6(i).ip)])
    net.client.run(["ip", "-6", "route", "add", "2001:2::/48", "via", str(UPSTREAM_CLIENT6.ip)])
    macs = [net._mac(net.router(i), net.ifname(f"r{i}", SWITCH)) for i in range(topo.routers)]
    for j in range(topo.backends):
        ns, dev = net.ns[f"b{j}"], net.ifname(f"b{j}", SWITCH)
        addr(f"b{j}", SWITCH, backend_addr6(j))
        ns.run(["ip", "-6", "route", "add", "default", "via", str(router_lan_addr6(0).ip), "dev", dev])
        marks = "\n".join(f"\t\tether saddr {mac} ct mark set {i + 1}" for i, mac in enumerate(macs))
        ns.run(
            ["nft", "-f", "-"],
            input="table ip6 edge_return6 {\n"
            "\tchain pre {\n\t\ttype filter hook prerouting priority mangle;\n" + marks + "\n\t}\n"
            "\tchain out {\n\t\ttype route hook output priority mangle;\n"
            "\t\tct mark != 0 meta mark set ct mark\n\t}\n}\n",
        )
        for i in range(topo.routers):
            table = str(LAN_TABLE_BASE + i)
            ns.run(
                ["ip", "-6", "route", "add", "default", "via", str(router_lan_addr6(i).ip), "dev", dev, "table", table]
            )
            ns.run(["ip", "-6", "rule", "add", "fwmark", str(i + 1), "lookup", table, "pref", str(1000 + i)])


def upstream_bird6(routers: int, hold_time_s: int) -> list[str]:
    """The upstream's IPv6 part of bird.conf: ipv6 kernel routes merged (ECMP), a session per router."""
    from controlplane.edged import bird
    from controlplane.lab.fleet import EDGE_AS, UPSTREAM_AS

    out = ["protocol kernel { ipv6 { import none; export all; }; merge paths on; }"]
    for i in range(routers):
        out.append(
            bird.bgp_protocol(
                f"edge6_r{i}",
                UPSTREAM_AS,
                router_up_addr6(i).ip,
                EDGE_AS,
                hold_time_s,
                True,
                import_="all",
                export="none",
                channel="ipv6",
            )
        )
    return out


def vip6_next_hops(net: "FleetNet") -> set[int]:
    """The routers (by index) the upstream's kernel sends the IPv6 VIP to now, known by the outgoing
    interface of each next hop (BIRD installs IPv6 next hops by their link-local address)."""
    with net.upstream.iproute() as ipr:
        routes = ipr.get_routes(table=254, family=10)
        index = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
    by_iface = {net.ifname("up", f"r{i}"): i for i in range(net.topo.routers)}
    hops = set()
    for r in routes:
        if r.get_attr("RTA_DST") != str(VIP6) or r["dst_len"] != 128:
            continue
        oifs = [r.get_attr("RTA_OIF")] + [nh["oif"] for nh in r.get_attr("RTA_MULTIPATH") or []]
        hops |= {by_iface[index[o]] for o in oifs if o and index.get(o) in by_iface}
    return hops
