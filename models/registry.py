"""Backends registered by name (Frigate's detector plugins): a backend is one module that declares its config
model (a pydantic model whose ``backend`` field is a ``Literal`` of its name) and registers a builder for it.
The config tree takes the union of the registered config models, discriminated by ``backend``, so a new backend
needs no other change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag

T = TypeVar("T")
C = TypeVar("C", bound="BackendConfig")


class BackendConfig(BaseModel):
    """Base of a backend's config: unknown keys are errors, as everywhere in the config tree."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    backend: str


@dataclass(frozen=True)
class Backend(Generic[T]):
    name: str
    config: type[BackendConfig]
    build: Callable[[Any], T]


class Registry(Generic[T]):
    """The backends of one kind (detector, ...), in registration order; ``default`` is taken when a config
    section gives no ``backend`` (so ``models.detector.weights`` alone still means the default backend)."""

    def __init__(self, kind: str, default: str) -> None:
        self.kind, self.default = kind, default
        self.backends: dict[str, Backend[T]] = {}

    def register(self, config: type[C]) -> Callable[[Callable[[C], T]], Callable[[C], T]]:
        """Decorate the builder of ``config``'s backend (the name is the default of its ``backend`` field)."""
        name = config.model_fields["backend"].default
        if not isinstance(name, str):
            raise TypeError(f"{config.__name__}.backend needs its name as the default")

        def add(build: Callable[[C], T]) -> Callable[[C], T]:
            if name in self.backends:
                raise ValueError(f"{self.kind} backend {name!r} is registered twice")
            self.backends[name] = Backend(name, config, build)
            return build

        return add

    def build(self, config: BackendConfig) -> T:
        return self.backends[config.backend].build(config)

    def default_config(self) -> BackendConfig:
        return self.backends[self.default].config()

    def config_type(self) -> Any:
        """``Annotated[Union[...], Discriminator]`` of the registered configs, for a pydantic field."""
        default = self.default

        def which(value: Any) -> str:
            if isinstance(value, dict):
                return value.get("backend", default)
            return getattr(value, "backend", default)

        members = tuple(Annotated[b.config, Tag(b.name)] for b in self.backends.values())
        return Annotated[Union[members], Discriminator(which)]  # noqa: UP007  (a runtime tuple of members)
