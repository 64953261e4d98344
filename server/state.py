"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

from aiohttp import web

from server.config import Settings
from server.media.sessions import SessionRegistry
from server.media.sources import SourceManager

SETTINGS = web.AppKey("settings", Settings)
SESSIONS = web.AppKey("sessions", SessionRegistry)
SOURCES = web.AppKey("sources", SourceManager)
WEBSOCKETS = web.AppKey("websockets", set[web.WebSocketResponse])
