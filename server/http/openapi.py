"""``/openapi.json``: built from the route table and the pydantic body models, so it cannot drift."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from server import __version__
from server.http.errors import ErrorBody, OpenAiErrorBody, is_openai_path


def build_openapi(routes: Iterable[Any]) -> dict[str, Any]:
    """The document for ``routes`` (``server.http.route.Route``s): errors in Vigil's shape, or OpenAI's under /v1/."""
    routes = list(routes)
    models: set[type[BaseModel]] = {ErrorBody, OpenAiErrorBody}
    for route in routes:
        models.update(m for m in (route.body, route.response) if m is not None)
    _, schemas = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "summary": route.summary,
            "operationId": route.handler.__name__,
            "responses": {},
        }
        params = [part[1:-1] for part in route.path.split("/") if part.startswith("{")]
        if params:
            operation["parameters"] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params
            ]
        if route.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{route.body.__name__}"}}},
            }
        form_fields = getattr(route, "form_fields", ())
        if form_fields:
            fields = {f: {"type": "string", "format": "binary"} if f == "file" else {"type": "string"}
                      for f in form_fields}
            # Beside a JSON body when the route takes either (a face enrolled from photos or from an event).
            body = operation.setdefault("requestBody", {"required": True, "content": {}})
            body["content"]["multipart/form-data"] = {"schema": {
                "type": "object", "properties": fields, "required": [f for f in ("file", "model") if f in fields]}}
        ok: dict[str, Any] = {"description": "OK" if route.status < 300 else "Switching protocols"}
        if route.status == 204:
            ok["description"] = "No content"
        elif route.response is not None:
            ok["content"] = {
                route.content_type: {"schema": {"$ref": f"#/components/schemas/{route.response.__name__}"}}
            }
        elif route.status != 101:
            ok["content"] = {route.content_type: {"schema": {}}}
        operation["responses"][str(route.status)] = ok
        error_shape = (OpenAiErrorBody if is_openai_path(route.path) else ErrorBody).__name__
        for status in route.errors:
            operation["responses"][str(status)] = {
                "description": "Error",
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{error_shape}"}}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Vigil", "version": __version__,
                 "description": "Real-time multimodal stream analysis server. Data-channel protocol: "
                                "docs/protocol.md."},
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
