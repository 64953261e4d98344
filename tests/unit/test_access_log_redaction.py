"""The access log's redaction (server/http/serve.py): secret-bearing query values are masked wherever a URL
appears in a logged field; everything else is left as it was, so the line still says what was asked."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import http_parser
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import HttpProcessingError

from server.http.errors import parser_error_reason
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
    # keys outside the old list, matched by pattern now
    ("GET /x?pw=1&access_key=2&passphrase=3&private_key=4&keyword=k HTTP/1.1",
     "GET /x?pw=***&access_key=***&passphrase=***&private_key=***&keyword=k HTTP/1.1"),
    ("GET /x?X-Amz-Signature=a&X-Amz-Credential=b&PHPSESSID=c&sid=d&session_id=e HTTP/1.1",
     "GET /x?X-Amz-Signature=***&X-Amz-Credential=***&PHPSESSID=***&sid=***&session_id=*** HTTP/1.1"),
    ("http://127.0.0.1/cb#access_token=abc&state=1", "http://127.0.0.1/cb#access_token=***&state=1"),
])
def test_secret_query_values_are_masked_and_nothing_else_changes(logged: str, expected: str):
    assert redact_query_secrets(logged) == expected


SECRET = "s3cret-0f9e"
HOSTILE_REQUESTS = [  # each quotes the secret in its parser's message, in one spelling or another
    f"GET /?token={SECRET}&password={SECRET}&q={'a' * 9000} HTTP/1.1\r\nHost: x\r\n\r\n",  # bytearray(b'...')
    f"GET /?q={'a' * 9000}&token={SECRET} HTTP/1.1\r\nHost: x\r\n\r\n",
    f"G@T /?token={SECRET} HTTP/1.1\r\nHost: x\r\n\r\n",
    f"GET /?token={SECRET} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\x01\r\n\r\n",
    f"GET /?token=a {SECRET} HTTP/1.1\r\nHost: x\r\n\r\n",
    f"{SECRET}?token={SECRET}\r\n\r\n",
    f"GET / HTTP/1.1\r\nHost: x\r\nX-Long: {SECRET}{'a' * 9000}\r\n\r\n",
]


@pytest.mark.parametrize("parser", ["c", "python"])
@pytest.mark.parametrize("raw", HOSTILE_REQUESTS, ids=range(len(HOSTILE_REQUESTS)))
def test_a_parser_error_is_described_without_the_bytes_it_quotes(parser: str, raw: str):
    """aiohttp's own parsers (its C parser, and the pure-Python one it falls back to) quote the raw request in
    their messages (``b'...'``, ``bytearray(b'...')``, ``'...'``): the reason Vigil answers and logs is chosen
    from the error, never cut out of that text."""
    parser_class = http_parser.HttpRequestParserPy if parser == "python" else http_parser.HttpRequestParser
    loop = asyncio.new_event_loop()
    try:
        request_parser = parser_class(BaseProtocol(loop), loop, 2**16, max_line_size=8190, max_field_size=8190)
        with pytest.raises(HttpProcessingError) as raised:
            request_parser.feed_data(raw.encode())
    finally:
        loop.close()
    quoted = [text for text in (SECRET, "aaaa", "G@T") if text in raised.value.message]
    assert quoted, raised.value.message  # the parser quotes the request: the test proves something
    reason = parser_error_reason(raised.value.message, raised.value)
    assert reason and not [text for text in quoted if text in reason], reason
