"""The typed keys of what the aiohttp application holds whose types no server module owns (the config, the
pipelines' stores, aiohttp's own); every other key sits beside its type (``SESSIONS`` in ``server.media.sessions``,
``CHAT_SERVICE`` in ``server.v1.chat_service``, ...), so that the plumbing every front-end imports imports none of
them. ``server.app`` sets every key once, from the ``Services`` that ``server.services.build_services`` built;
handlers only read them."""

from __future__ import annotations

import asyncio

from aiohttp import web

from pipelines.memory.index import MemoryIndex
from pipelines.timeline.store import TimelineStore
from server.config import Settings

SETTINGS = web.AppKey("settings", Settings)
WEBSOCKETS = web.AppKey("websockets", set[web.WebSocketResponse])
REDIS = web.AppKey("redis", object)  # only with redis.url
TIMELINE = web.AppKey("timeline", TimelineStore)  # only with storage.enabled
MEMORY = web.AppKey("memory", MemoryIndex)  # only with memory.enabled
MEMORY_CATCH_UP = web.AppKey("memory_catch_up", asyncio.Task)  # indexing what the last run missed (start-up)
