"""Which host addresses ICE may offer.

aioice gathers every non-loopback address and has no option to choose; ``webrtc.host_addresses`` replaces
its address lookup (process-wide, as aioice's is), e.g. with ``["127.0.0.1"]`` for loopback-only tests.
"""

from __future__ import annotations

import aioice.ice

_original = aioice.ice.get_host_addresses


def restrict_host_addresses(addresses: list[str] | None) -> None:
    if not addresses:
        aioice.ice.get_host_addresses = _original
        return
    chosen = list(addresses)

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses
