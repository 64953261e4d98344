"""``vigil analyze``: the pipelines over a file with no network, as fast as possible, on a virtual clock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipelines.clock import VirtualClock
from pipelines.protocol import Event, ServerMessage
from pipelines.sources.container import ContainerSource, SourceState
from server.config import Settings
from server.engines import close_shared_llm
from server.sessions import Analyzers


async def analyze_file(
    path: Path,
    settings: Settings,
    write: Callable[[ServerMessage], None],
    analyzers: Analyzers | None = None,
    on_progress: Callable[[float, float | None], None] | None = None,
) -> SourceState:
    """Run the session pipeline over ``path``; every message goes to ``write``. Deterministic."""
    analyzers = analyzers or Analyzers()
    pipeline = analyzers.pipeline(settings, path.stem, origin="file", clock=VirtualClock(), emit=write,
                                  config=settings.session_defaults())

    def on_state(state: SourceState, detail: dict) -> None:
        if state == SourceState.LIVE:
            pipeline.hello()
        pipeline.send(Event, name="source.state", data={"state": state.value, **detail})

    reader = ContainerSource(str(path), pipeline, kind="file", realtime=False, on_state=on_state,
                             on_progress=on_progress)
    pipeline.start()
    try:
        await reader.start()
        await pipeline.close()
    finally:
        await analyzers.close()
        await close_shared_llm(settings)  # the voice loop's router, when the LLM is an HTTP upstream
    return reader.state
