"""``webrtc``: ICE addresses and servers, data-channel limits."""

from __future__ import annotations

from pydantic import Field, SecretStr

from server.config.api import RateLimit
from server.config.base import Section


class IceServer(Section):
    urls: list[str]
    username: str | None = None
    credential: SecretStr | None = None


class WebRTCSettings(Section):
    host_addresses: list[str] = Field(
        default_factory=list,
        description="Host addresses ICE may offer (e.g. ['127.0.0.1']); empty: every non-loopback address.",
    )
    ice_servers: list[IceServer] = Field(
        default_factory=list, description="STUN/TURN servers. Empty by default: no public server is contacted."
    )
    max_message_bytes: int = Field(64 * 1024, ge=256, description="Largest accepted data-channel message.")
    connect_timeout_s: float = Field(
        10.0, gt=0, description="A session whose peer never connects is closed (and its slot freed) after this."
    )
    offer_rate_limit: RateLimit | None = Field(
        RateLimit(requests=60, window_s=60.0),
        description="Offers per client address in a sliding window (refused ones count); beyond it 429 with "
        "Retry-After. None: unlimited.",
    )
