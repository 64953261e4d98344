"""One documented HTTP route: the route tables of every API module are made of these, and ``/openapi.json`` is
built from them (``server.http.openapi``). Its own module so that API modules and the OpenAPI handler import it
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Any
    summary: str
    body: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    errors: tuple[int, ...] = ()
    content_type: str = "application/json"
    form_fields: tuple[str, ...] = ()  # a multipart/form-data body (no pydantic model): its field names
    head: bool = False  # a GET that answers HEAD too (the /v1 and cluster GETs always have)
