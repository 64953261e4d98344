"""``vigil analyze``: the pipelines over a file with no network, as fast as possible, on a virtual clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipelines.clock import VirtualClock
from pipelines.protocol import Event, ServerMessage
from pipelines.sources.container import ContainerSource, SourceState
from server.config import Settings
from server.engines import Analyzers, Engines
from server.services import open_timeline, recorder_factory


async def analyze_file(
    path: Path,
    settings: Settings,
    write: Callable[[ServerMessage], None],
    engines: Engines | None = None,
    on_progress: Callable[[float, float | None], None] | None = None,
    events_dir: Path | None = None,
) -> SourceState:
    """Run the session pipeline over ``path``; every message goes to ``write``. Deterministic. ``engines``: the
    models (the same ``Engines`` as ``vigil serve``; None: counting only), closed here when done.

    ``events_dir``: also store the timeline there (events with clips and snapshots, as ``storage.data_dir`` of a
    server; a server pointed at it lists and serves them)."""
    engines = engines or Engines(settings, Analyzers())
    analyzers = await asyncio.to_thread(lambda: engines.analyzers)  # loads the models (blocking) off the loop
    store, recorder = None, None
    if events_dir is not None:
        settings = settings.model_copy(update={"storage": settings.storage.model_copy(
            update={"enabled": True, "data_dir": events_dir})})
        store = await asyncio.to_thread(open_timeline, settings)
        if store.open_error is not None:
            raise OSError(store.open_error)
        executor = ThreadPoolExecutor(1, thread_name_prefix="vigil-clips")
        recorder = recorder_factory(settings, store, executor)("file", path.name)
    pipeline = analyzers.pipeline(settings, path.stem, origin="file", clock=VirtualClock(), emit=write,
                                  config=settings.session_defaults(), timeline=recorder)

    def on_state(state: SourceState, detail: dict) -> None:
        if state == SourceState.LIVE:
            pipeline.hello()
        pipeline.send(Event, name="source.state", data={"state": state.value, **detail})

    reader = ContainerSource(str(path), pipeline, kind="file", realtime=False, on_state=on_state,
                             on_progress=on_progress, packet_sink=recorder)
    pipeline.start()
    try:
        await reader.start()
        await pipeline.close()
    finally:
        if store is not None:
            await asyncio.to_thread(executor.shutdown, True)
            await asyncio.to_thread(store.close)
        await engines.close_session_models()
        await engines.close()  # e.g. the voice loop's router, when the LLM is an HTTP upstream
    return reader.state
