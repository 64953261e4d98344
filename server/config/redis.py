"""``redis``: shared rate limits and caches."""

from __future__ import annotations

from pydantic import Field, SecretStr

from server.config.base import Section


class RedisSettings(Section):
    url: SecretStr | None = Field(
        None, description="e.g. redis://127.0.0.1:6379/0 (may hold a password); when set, API rate limits and "
        "caches live in Redis and are shared by every Vigil process using it."
    )
    key_prefix: str = Field("vigil:", description="Prefix of every key Vigil writes.")
