"""``auth``: the bearer token of every API endpoint."""

from __future__ import annotations

from pydantic import Field, SecretStr

from server.config.base import Section


class AuthSettings(Section):
    token: SecretStr | None = Field(
        None, description="When set, every API endpoint needs 'Authorization: Bearer <token>' (or ?token=)."
    )
