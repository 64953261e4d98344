"""Where the voice loop's parts send their messages: the session pipeline the loop is attached to (nothing before
``attach`` nor after ``close``). The parts hold this, never the loop, so a closed session's loop is freed by
reference counting alone (no cycle through a part back to the loop)."""

from __future__ import annotations

from typing import Any

from pipelines.ports import SessionView


class Outbox:
    def __init__(self) -> None:
        self.pipeline: SessionView | None = None

    def send(self, message_type: type, **fields: Any) -> None:
        if self.pipeline is not None:
            self.pipeline.send(message_type, **fields)

    def error(self, code: str, message: str) -> None:
        if self.pipeline is not None:
            self.pipeline.error(code, message)

    @property
    def virtual(self) -> bool:
        """Offline replay (a virtual clock): the parts run in order, deterministically, and no audio plays."""
        return self.pipeline is not None and self.pipeline.clock.virtual
