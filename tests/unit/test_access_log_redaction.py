"""The access log's redaction (server/http/serve.py): secret-bearing query values are masked wherever a URL
appears in a logged field; everything else is left as it was, so the line still says what was asked."""

from __future__ import annotations

import pytest

from server.http.serve import redact_query_secrets


@pytest.mark.parametrize("logged, expected", [
    ("GET /api/sources?token=abc HTTP/1.1", "GET /api/sources?token=*** HTTP/1.1"),
    ("GET /x?limit=5&api_key=k-1&name=a HTTP/1.1", "GET /x?limit=5&api_key=***&name=a HTTP/1.1"),
    ("GET /x?to%6Ben=abc HTTP/1.1", "GET /x?to%6Ben=*** HTTP/1.1"),  # decoded, the key is `token`
    ("GET /x?Access_Token=abc&apiKey=def HTTP/1.1", "GET /x?Access_Token=***&apiKey=*** HTTP/1.1"),
    ("GET /x?token= HTTP/1.1", "GET /x?token=*** HTTP/1.1"),
    ("GET /x?a=1;password=hunter2 HTTP/1.1", "GET /x?a=1;password=*** HTTP/1.1"),
    ("http://127.0.0.1:8080/?token=abc#live", "http://127.0.0.1:8080/?token=***#live"),  # a Referer
    ("rtsp://admin:hunter2@cam/stream?secret=x", "rtsp://admin:***@cam/stream?secret=***"),
    ("GET /api/search?q=token&limit=10&keyword=a HTTP/1.1", "GET /api/search?q=token&limit=10&keyword=a HTTP/1.1"),
    ("-", "-"),
])
def test_secret_query_values_are_masked_and_nothing_else_changes(logged: str, expected: str):
    assert redact_query_secrets(logged) == expected
