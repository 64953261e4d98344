"""One error model for every entrypoint: an ``ApiError`` carries a code (never a transport status), a message,
and optionally the parameter at fault and structured details. The edges translate the code: HTTP status and
body shape in ``server.http.errors``, gRPC status in ``server.grpc_api``, an ``error`` message on the data channel.

Also here, because the data channel, the HTTP bodies and the config loader all need them: ``parse_json`` (every
way a JSON text can fail to parse becomes one ``invalid_json`` error) and ``describe_validation_error`` (one
wording for pydantic's validation errors); and ``parse_number``, the one parser of numbers given as text (query
strings, form fields), which refuses what ``float``/``int`` let through: non-finite values and integers beyond SQLite's
64 bits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


class ApiError(Exception):
    """Raise anywhere to refuse a request with a code the client can act on.

    ``code`` names what went wrong (``invalid_json``, ``model_not_found``, ``server_busy`` ...); the edge maps it
    to a transport status. ``kind`` overrides that mapping with a generic code (e.g. ``forbidden``) where one
    specific code covers cases the client must tell apart by status. ``headers`` are extra HTTP response headers,
    for the HTTP edge's own errors only (rate-limit counters)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        details: list[dict[str, Any]] | None = None,
        kind: str | None = None,
        retry_after_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.details = details
        self.kind = kind
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})

    def __repr__(self) -> str:
        return f"ApiError({self.code!r}, {self.message!r})"


# ---------------------------------------------------------------- pydantic validation errors


@dataclass(frozen=True)
class Issue:
    """One problem pydantic found: where (``messages[0].role``), what, and the value it got."""

    location: str
    message: str
    value: Any


def _location(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def validation_issues(error: ValidationError) -> list[Issue]:
    return [Issue(_location(item["loc"]), item["msg"], item.get("input")) for item in error.errors()]


def describe_validation_error(error: ValidationError, *, root: str = "<body>", with_values: bool = False,
                              separator: str = "; ", limit: int | None = 2000) -> str:
    """Every issue as ``location: message`` (``root`` for the whole document), optionally with the value given."""
    parts = []
    for issue in validation_issues(error):
        text = f"{issue.location or root}: {issue.message}"
        if with_values and issue.location:  # the whole document as "value" is noise, and may hold secrets
            text += f" (got {issue.value!r})"
        parts.append(text)
    joined = separator.join(parts)
    return joined[:limit] if limit is not None else joined


def invalid_body(error: ValidationError, *, root: str = "<body>", code: str = "invalid_body") -> ApiError:
    """A validation error as an ApiError: the first issue's location is the parameter at fault."""
    issues = validation_issues(error)
    param = issues[0].location or None if issues else None
    return ApiError(code, describe_validation_error(error, root=root), param=param,
                    details=[{"param": i.location, "message": i.message} for i in issues[:20]])


# ---------------------------------------------------------------- numbers and JSON texts


# SQLite stores integers in 64 bits: a larger Python int raises OverflowError inside the query.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def parse_number(name: str, raw: str, *, integer: bool = False, minimum: float | None = None,
                 maximum: float | None = None, code: str = "invalid_parameter", what: str | None = None) -> Any:
    """``raw`` (a query parameter, a form field) as a finite float, or an int when ``integer`` (never beyond 64
    bits), within [``minimum``, ``maximum``]; anything else is an ApiError ``code`` whose message and ``param``
    name ``name``. ``what`` words the expected value (default: the kind, and the range when one is given)."""
    low = minimum if minimum is not None else INT64_MIN if integer else -math.inf
    high = maximum if maximum is not None else INT64_MAX if integer else math.inf
    if what is None and (minimum is not None or maximum is not None):
        what = f"an integer from {low} to {high}" if integer else f"a number from {low:g} to {high:g}"
    elif what is None:
        what = "a 64-bit integer" if integer else "a finite number"
    try:
        value: float = int(raw) if integer else float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise ApiError(code, f"{name} must be {what} (got {raw[:64]!r})", param=name)
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: JSON has no infinity
        raise ValueError(f"number out of range: {text[:64]}")
    return value


def _int64(text: str) -> int:
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:  # no field takes more, and SQLite cannot store it
        raise ValueError(f"integer out of range: {text[:64]}")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")  # NaN, Infinity, -Infinity: Python's extension, not JSON


def parse_json(raw: str | bytes | bytearray, *, what: str = "body") -> Any:
    """Parse a JSON text; any failure (syntax, invalid UTF-8, lone surrogates, nesting too deep for the parser)
    is an ``invalid_json`` ApiError, never an exception the caller did not expect."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
        text.encode("utf-8")  # a str from a transport may hold lone surrogates: refuse them here, not later
        data = json.loads(text, parse_float=_finite_float, parse_int=_int64, parse_constant=_no_constant)
        if "\\u" in text:  # escapes can spell lone surrogates too, which break every later encode
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        return data
    except UnicodeError as error:
        raise ApiError("invalid_json", f"{what} is not valid UTF-8 text: {error}") from None
    except RecursionError:
        raise ApiError("invalid_json", f"{what} is nested too deeply") from None
    except ValueError as error:
        raise ApiError("invalid_json", f"{what} is not valid JSON: {error}") from None
