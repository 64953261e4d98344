"""One error model at the HTTP edge: every malformed JSON body on every JSON route is a 400 ``invalid_json``, in
Vigil's shape or (under /v1) in OpenAI's; a wrong top-level type is the body's validation error; and the server
keeps serving."""

from __future__ import annotations

import aiohttp
import pytest

from tests.integration.test_memory import _memory

MALFORMED = [
    b"{nope",  # syntax
    b'{"sdp": "\xff"}',  # invalid UTF-8
    b'{"sdp": "\\ud800", "type": "offer"}',  # a lone surrogate, escaped
    b"[" * 50_000 + b"]" * 50_000,  # deeper than the parser recurses
]
DOCUMENTS = "/api/collections/manuals/documents"  # memory is on for this route only (it loads the embedder)
ROUTES = ["/offer", "/api/sources", "/api/sessions/nope/config", "/v1/chat/completions", "/v1/audio/speech",
          DOCUMENTS]


async def _post(url: str, body: bytes) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.post(
        url, data=body, headers={"Content-Type": "application/json"}
    ) as response:
        return response.status, await response.json()


@pytest.mark.parametrize("route", ROUTES)
async def test_every_malformed_json_body_is_a_400(vigil, tmp_path, route):
    server = await vigil(**({"memory": _memory(tmp_path)} if route == DOCUMENTS else {}))
    for body in MALFORMED:
        status, answer = await _post(server.url + route, body)
        if route == "/api/sessions/nope/config":
            assert status == 404, answer  # the session is looked up first
            continue
        assert status == 400, (body[:20], answer)
        error = answer["error"]
        assert error["code"] == "invalid_json" and error["message"]
        if route.startswith("/v1/"):
            assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        else:
            assert set(error) == {"code", "message"}
    status, _ = await _post(server.url + "/v1/chat/completions", b"[]")  # valid JSON, wrong type: OpenAI's 400
    assert status == 400
    status, answer = await _post(server.url + "/offer", b"[]")  # ... Vigil's 422
    assert status == 422 and answer["error"]["code"] == "invalid_body"
    if route == DOCUMENTS:  # a document's validation error names the field, and never echoes the document
        status, answer = await _post(server.url + route, b'{"name": "n", "text": "secret words", "extra": 1}')
        assert status == 422 and answer["error"]["code"] == "invalid_body", answer
        assert answer["error"]["details"][0]["param"] == "extra" and "secret words" not in str(answer)
    async with aiohttp.ClientSession() as http, http.get(server.url + "/healthz") as response:
        assert response.status == 200


async def test_an_unknown_route_under_v1_answers_in_openais_shape(vigil):
    server = await vigil()
    async with aiohttp.ClientSession() as http, http.get(server.url + "/v1/nothing/here") as response:
        body = await response.json()
    assert response.status == 404
    assert body == {"error": {"message": "Not Found", "type": "not_found_error", "param": None,
                              "code": "not_found"}}


async def test_openapi_documents_each_route_familys_error_shape(vigil):
    server = await vigil()
    async with aiohttp.ClientSession() as http, http.get(server.url + "/openapi.json") as response:
        spec = await response.json()

    def error_schema(path: str, method: str, status: str) -> str:
        content = spec["paths"][path][method]["responses"][status]["content"]["application/json"]
        return content["schema"]["$ref"].rsplit("/", 1)[1]

    assert error_schema("/v1/chat/completions", "post", "401") == "OpenAiErrorBody"
    assert error_schema("/v1/audio/speech", "post", "400") == "OpenAiErrorBody"
    assert error_schema("/offer", "post", "422") == "ErrorBody"
    openai_shape = spec["components"]["schemas"]["OpenAiErrorDetail"]
    assert set(openai_shape["properties"]) == {"message", "type", "param", "code"}
    # and the documented shape is the one sent
    async with aiohttp.ClientSession() as http, http.post(server.url + "/v1/chat/completions", data=b"{") as reply:
        assert set((await reply.json())["error"]) == set(openai_shape["properties"])
