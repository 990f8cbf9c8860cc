"""The base of every settings model: frozen, unknown keys are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Frozen, and unknown keys are errors: a typo never silently falls back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)
