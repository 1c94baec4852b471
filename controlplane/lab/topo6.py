"""IPv6 addresses of the namespace lab (topo.py's Topo inherits them), all from 2001:2::/48, the
benchmarking range: client 2001:2::2/64, router 2001:2::1/64 on its client side; backend i
2001:2:0:{i+1:x}::2/64, router ...::1/64 facing it; the IPv6 VIP 2001:2:0:ffff::1 on no interface."""

from __future__ import annotations

from ipaddress import IPv6Address, IPv6Interface, IPv6Network

TEST_RANGE6 = IPv6Network("2001:2::/48")


class Topo6:
    """IPv6 addresses by role (mixed into Topo, which checks backend indexes)."""

    def _check_backend(self, i: int) -> None:
        raise NotImplementedError

    @property
    def client_addr6(self) -> IPv6Interface:
        return IPv6Interface("2001:2::2/64")

    @property
    def router_client_addr6(self) -> IPv6Interface:
        return IPv6Interface("2001:2::1/64")

    def backend_addr6(self, i: int) -> IPv6Interface:
        self._check_backend(i)
        return IPv6Interface(f"2001:2:0:{i + 1:x}::2/64")

    def router_backend_addr6(self, i: int) -> IPv6Interface:
        self._check_backend(i)
        return IPv6Interface(f"2001:2:0:{i + 1:x}::1/64")

    @property
    def vip6(self) -> IPv6Address:
        """The IPv6 VIP, on no interface (as the IPv4 one)."""
        return IPv6Address("2001:2:0:ffff::1")

    @property
    def vip6_route(self) -> IPv6Network:
        return IPv6Network("2001:2:0:ffff::/64")
