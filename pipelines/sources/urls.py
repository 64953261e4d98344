"""Source URLs: normalised before validation, and never shown with their password.

One redaction helper serves every place a URL or a message about it can reach a user or a log: source
listings, ``state_detail.reason``, ``source.state`` events, log lines and errors. FFmpeg's messages quote
the URL it was given (credentials included), so free text is redacted too, not only URLs.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
SOURCE_SCHEMES = ("rtsp", "rtsps")

# scheme://user:password@ anywhere in a text (FFmpeg's messages, exception strings); the password ends at
# the last '@' before the host, so a password holding '@' or ':' is masked whole.
_CREDENTIALS = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*:)(?P<password>[^\s/]*)@")
# scheme://token@: userinfo with no ':' is a bearer secret of its own (a camera token), masked whole.
_TOKEN = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<token>[^\s:/@]+)@")


class InvalidSourceUrl(ValueError):
    """The URL cannot name a camera; the message never quotes the URL (it may hold a password)."""


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (user and host stay, so it can still be recognised); a
    userinfo with no password (``rtsp://token@host``) is taken for a token and masked whole."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or not userinfo:
        return url
    if ":" not in userinfo:
        return urlunsplit(parts._replace(netloc=f"{MASK}@{hostport}"))
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{hostport}"))


def url_secrets(url: str) -> tuple[str, ...]:
    """The password (or the token of a password-less userinfo) in ``url``, as written and percent-decoded
    (FFmpeg may quote either)."""
    userinfo, at, _ = urlsplit(url).netloc.rpartition("@")
    if not at:
        return ()
    secret = userinfo.split(":", 1)[1] if ":" in userinfo else userinfo
    return tuple(s for s in {secret, unquote(secret)} if s)


def redact_text(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` (an error, a log message) with credentials in URLs and every known secret masked."""
    text = _CREDENTIALS.sub(lambda m: m["head"] + MASK + "@", text)
    text = _TOKEN.sub(lambda m: m["head"] + MASK + "@", text)
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
