"""Server-Sent Events, as OpenAI's streaming endpoints frame them."""

from __future__ import annotations

import json
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"
