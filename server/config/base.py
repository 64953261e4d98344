"""What every config section shares."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
