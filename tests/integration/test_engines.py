"""The test suite's explicit model seam: every server the ``vigil`` fixture starts builds its own engines but
takes loaded weights from the one session ``model_pool`` (so Whisper, Piper, the LLM and MiniLM load once per
test session, and nothing depends on a hidden process-wide cache)."""

from __future__ import annotations

import asyncio

from server.engines import ENGINES


async def test_every_server_takes_its_weights_from_the_session_pool(vigil, model_pool):
    first, second = await vigil(), await vigil(models={"tts": {"backend": "espeak"}})
    assert first.app[ENGINES] is not second.app[ENGINES]  # each app owns its engines ...
    assert first.app[ENGINES].models is model_pool and second.app[ENGINES].models is model_pool  # ... not weights
    embedder = await asyncio.to_thread(first.app[ENGINES].embedder)
    assert await asyncio.to_thread(second.app[ENGINES].embedder) is embedder  # loaded once, for both
    await first.stop()  # an app's stop leaves the pool (and what it loaded) to its owner
    third = await vigil()
    assert await asyncio.to_thread(third.app[ENGINES].embedder) is embedder
