"""The error model: every JSON parse failure is one ``invalid_json`` error, validation errors read the same
everywhere, and a code alone decides the HTTP status and the OpenAI error type."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from pipelines.errors import ApiError, describe_validation_error, invalid_body, parse_json, parse_number
from server.http.errors import http_status, openai_error_body, vigil_error_body


@pytest.mark.parametrize("raw", [
    b"{nope", b"\xff\xfe{}", '"\ud800"', '"\\ud800"', b'{"a": "\\udc00"}', "[" * 100_000, b"",
    # Python's JSON extensions and numbers no field can hold: refused, not turned into nan/inf or a huge int
    b'{"a": NaN}', b'{"a": Infinity}', b'[-Infinity]', b'{"a": 1e400}', b'[-1e400]', b'[9223372036854775808]',
])
def test_every_parse_failure_is_invalid_json(raw):
    with pytest.raises(ApiError) as error:
        parse_json(raw)
    assert error.value.code == "invalid_json" and error.value.message


def test_valid_json_parses_including_escaped_pairs():
    assert parse_json(b'{"a": [1, "\\ud83d\\ude00"]}') == {"a": [1, "\U0001F600"]}
    assert parse_json(b'[1.5e300, -9223372036854775808, 9223372036854775807]') == [1.5e300, -2**63, 2**63 - 1]


@pytest.mark.parametrize("raw, options", [
    ("nan", {}), ("inf", {}), ("-inf", {}), ("1e400", {}), ("-Infinity", {}), ("soon", {}), ("", {}),
    ("9223372036854775808", {"integer": True}), ("-9223372036854775809", {"integer": True}),
    ("1.5", {"integer": True}), ("0", {"integer": True, "minimum": 1, "maximum": 10}),
    ("1.01", {"minimum": 0.0, "maximum": 1.0}),
])
def test_numbers_in_text_are_finite_in_range_and_named(raw, options):
    with pytest.raises(ApiError) as error:
        parse_number("cursor", raw, code="invalid_parameter", **options)
    assert error.value.code == "invalid_parameter" and error.value.param == "cursor"
    assert error.value.message.startswith("cursor must be ")


def test_numbers_in_text_parse():
    assert parse_number("since", "1700000000.5") == 1700000000.5
    assert parse_number("cursor", "9223372036854775807", integer=True) == 2**63 - 1
    assert parse_number("limit", "10", integer=True, minimum=1, maximum=10) == 10


class Item(BaseModel):
    name: str
    sizes: list[int]


def test_validation_errors_name_their_location():
    with pytest.raises(ValidationError) as caught:
        Item.model_validate({"sizes": [1, "x"]})
    text = describe_validation_error(caught.value)
    assert "name: Field required" in text and "sizes[1]: " in text
    error = invalid_body(caught.value)
    assert error.code == "invalid_body" and error.param == "name" and len(error.details) == 2
    with pytest.raises(ValidationError) as whole:
        Item.model_validate([])
    assert describe_validation_error(whole.value, root="<message>").startswith("<message>: ")
    assert "(got" not in describe_validation_error(whole.value, with_values=True)  # no whole documents (secrets)
    with pytest.raises(ValidationError) as one:
        Item.model_validate({"name": "n", "sizes": "x"})
    assert "sizes: " in (text := describe_validation_error(one.value, with_values=True)) and "(got 'x')" in text


@pytest.mark.parametrize(("code", "vigil", "openai", "openai_type"), [
    ("invalid_json", 400, 400, "invalid_request_error"),
    ("invalid_body", 422, 400, "invalid_request_error"),
    ("unsupported_media_type", 415, 400, "invalid_request_error"),
    ("invalid_api_key", 401, 401, "authentication_error"),
    ("model_not_found", 404, 404, "invalid_request_error"),
    ("job_not_active", 409, 409, "invalid_request_error"),
    ("rate_limit_exceeded", 429, 429, "rate_limit_exceeded"),
    ("server_busy", 503, 503, "server_error"),
    ("context_length_exceeded", 400, 400, "invalid_request_error"),  # unlisted: the client's to fix
])
def test_the_code_decides_the_status(code, vigil, openai, openai_type):
    error = ApiError(code, "message", param="p")
    assert http_status(error) == vigil and http_status(error, openai=True) == openai
    assert openai_error_body(error) == {"error": {"message": "message", "type": openai_type, "param": "p",
                                                  "code": code}}
    assert vigil_error_body(error) == {"error": {"code": code, "message": "message"}}


def test_a_kind_overrides_the_status_but_not_the_code():
    error = ApiError("invalid_path", "path is outside the media root", kind="forbidden")
    assert http_status(error) == 403 and vigil_error_body(error)["error"]["code"] == "invalid_path"


def test_the_generic_code_is_null_in_openais_shape():
    body = openai_error_body(ApiError("invalid_request", "n must be 1", param="n"))["error"]
    assert body["code"] is None and body["type"] == "invalid_request_error"
