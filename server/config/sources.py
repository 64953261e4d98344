"""``sources``: server-side RTSP cameras and files."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from server.config.base import Section


class SourcesSettings(Section):
    media_root: Path = Field(Path("media"), description="The only directory file replay may read.")
    rtsp_transport: Literal["tcp", "udp"] = "tcp"
    open_timeout_s: float = Field(10.0, gt=0)
    read_timeout_s: float = Field(5.0, gt=0)
    reconnect_initial_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(30.0, gt=0)
    max_subscribers: int = Field(
        32, ge=1, description="WebSocket subscribers per source (/api/sources/{id}/results); more get 429.")
