"""Source URLs: normalised before validation, and never shown with their secrets: the userinfo password (or
token), and the values of secret-looking query and path parameters (``?password=``, ``?token=``, ``;auth=``...).

One redaction helper serves every place a URL or a message about it can reach a user or a log: source
listings, ``state_detail.reason``, ``source.state`` events, log lines and errors, and the access log. FFmpeg's
messages quote the URL it was given (credentials included), so free text is redacted too, not only URLs.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

MASK = "***"
SOURCE_SCHEMES = ("rtsp", "rtsps")

# scheme://user:password@ anywhere in a text (FFmpeg's messages, exception strings); the password ends at
# the last '@' before the host, so a password holding '@' or ':' is masked whole.
_CREDENTIALS = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*:)(?P<password>[^\s/]*)@")
# scheme://token@: userinfo with no ':' is a bearer secret of its own (a camera token), masked whole.
_TOKEN = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<token>[^\s:/@]+)@")
# Query and path-parameter keys whose values are secrets, decided on the decoded key (aiohttp decodes `%74oken` to
# `token`, and so may a camera), by pattern (`pw`, `access_key`, `passphrase`, `private_key` were shown):
# a word of the key (split at `_`, `-`, `.` and camelCase) in _SECRET_WORDS, or the key, its separators dropped,
# holding one of _SECRET_PARTS. `keyword`, `q`, `limit` are not secrets; `author` is masked (`auth`): better one
# harmless value hidden than one secret shown.
_SECRET_WORDS = frozenset({"pw", "pwd", "pass", "key", "sig", "sid", "otp", "pin", "hmac", "jwt", "bearer", "cookie"})
_SECRET_PARTS = ("token", "secret", "passw", "passphrase", "passcode", "auth", "credential", "signature", "session",
                 "sessid", "apikey", "accesskey", "privatekey", "secretkey", "signingkey", "clientkey")
_KEY_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
# key=value in a query (`?`, `&`) or a path parameter (`;`), in free text quoting a URL (FFmpeg's messages); the
# value ends where the pair or the URL does (a path parameter's also at the next `/` or `?`).
_QUERY_PAIR = re.compile(r"(?:(?P<param>;)|[?&])(?P<key>[^=&;?#\s\"']+)="
                         r"(?P<value>(?(param)[^&;#?/\s\"']*|[^&;#\s\"']*))")


def is_secret_key(key: str) -> bool:
    """Whether a query or path parameter named ``key`` (as written: percent-encoded or not) holds a secret:
    ``token``, ``api_key``, ``apiKey``, ``X-Amz-Signature``, ``pw``, ``passphrase``, ``PHPSESSID``..."""
    decoded = unquote_plus(key)
    words = [word.lower() for word in _KEY_WORDS.findall(decoded)]
    joined = "".join(words)
    return any(word in _SECRET_WORDS for word in words) or any(part in joined for part in _SECRET_PARTS)


def redact_query(query: str) -> str:
    """A raw query string (or a fragment of ``key=value`` pairs) with the value of each secret-looking parameter
    masked. The string is split into its parameters as a server parses it (at ``&`` and ``;``), each key is decoded
    and judged (``is_secret_key``), and everything else is kept byte for byte, so the line still says what was
    asked."""
    parts = re.split(r"([&;])", query)
    for index in range(0, len(parts), 2):
        key, eq, _ = parts[index].partition("=")
        if eq and is_secret_key(key):
            parts[index] = f"{key}={MASK}"
    return "".join(parts)


def _redact_path(path: str) -> str:
    """A URL path with the values of secret-looking path parameters masked (``/stream;auth=x/1``)."""
    segments = path.split("/")
    for index, segment in enumerate(segments):
        head, semicolon, params = segment.partition(";")
        if semicolon:
            segments[index] = head + semicolon + redact_query(params)
    return "/".join(segments)


def redact_target(target: str) -> str:
    """An HTTP request target (``/path;p=v?query#fragment``, as on the request line) with every secret-looking
    parameter's value masked: parsed into path, query and fragment, then parameter by parameter."""
    rest, hash_, fragment = target.partition("#")
    path, question, query = rest.partition("?")
    return (_redact_path(path) + question + redact_query(query)
            + hash_ + (redact_query(fragment) if "=" in fragment else fragment))  # `#access_token=` (OAuth)


class InvalidSourceUrl(ValueError):
    """The URL cannot name a camera; the message never quotes the URL (it may hold a password)."""


def _secret_pairs(text: str) -> list[re.Match[str]]:
    return [m for m in _QUERY_PAIR.finditer(text) if is_secret_key(m["key"])]


def _mask_secret_pairs(text: str) -> str:
    """Free text quoting URLs: found by their shape (``_QUERY_PAIR``), since there is nothing to parse."""
    def mask(match: re.Match[str]) -> str:
        if is_secret_key(match["key"]):
            return match[0][:match.start("value") - match.start()] + MASK
        return match[0]

    return _QUERY_PAIR.sub(mask, text)


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (user and host stay, so it can still be recognised), and the
    value of every secret-looking query or path parameter too (``?password=***``, ``;auth=***``); a userinfo
    with no password (``rtsp://token@host``) is taken for a token and masked whole. The URL is parsed, not
    searched: a URL without a scheme and host (a bare path) is taken for a request target."""
    parts = urlsplit(url)
    if not parts.netloc:
        return redact_target(url)
    start = url.index("//") + 2  # the netloc follows the first '//' (urlsplit's own rule)
    head, rest = url[:start], url[start + len(parts.netloc):]
    userinfo, at, hostport = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at and userinfo:
        netloc = f"{MASK}@{hostport}" if ":" not in userinfo else f"{userinfo.split(':', 1)[0]}:{MASK}@{hostport}"
    return head + netloc + redact_target(rest)


def url_secrets(url: str) -> tuple[str, ...]:
    """The password (or the token of a password-less userinfo) and the values of secret-looking query and path
    parameters in ``url``, each as written and percent-decoded (FFmpeg may quote either)."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    written = [userinfo.split(":", 1)[1] if ":" in userinfo else userinfo] if at else []
    written += [m["value"] for m in _secret_pairs(url[len(parts.scheme) + 3 + len(parts.netloc):])]
    found = {form for secret in written for form in (secret, unquote(secret), unquote_plus(secret))}
    return tuple(sorted(s for s in found if s))


def redact_text(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` (an error, a log message, a request line) with credentials in URLs, secret-looking query and
    path parameters, and every known secret masked."""
    text = _CREDENTIALS.sub(lambda m: m["head"] + MASK + "@", text)
    text = _TOKEN.sub(lambda m: m["head"] + MASK + "@", text)
    text = _mask_secret_pairs(text)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def normalize_source_url(url: str) -> str:
    """A camera URL as FFmpeg should get it: surrounding whitespace removed, the scheme in lower case; refuses
    what is not ``rtsp[s]://host[:port][/path]`` (no host, ``rtsp:/path``, whitespace or control characters
    inside, a bad port). Raises InvalidSourceUrl."""
    url = url.strip()
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise InvalidSourceUrl("url must not contain whitespace or control characters")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SOURCE_SCHEMES:
        raise InvalidSourceUrl("url must be rtsp:// or rtsps://")
    if not url[len(scheme) + 1:].startswith("//") or not parts.hostname:
        raise InvalidSourceUrl("url needs a host: rtsp://host[:port]/path")
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError:
        raise InvalidSourceUrl("url has an invalid port") from None
    return urlunsplit(parts._replace(scheme=scheme))
