"""Backends registered by name (Frigate's detector plugins): a backend is one module that declares its config
model (a pydantic model whose ``backend`` field is a ``Literal`` of its name) and registers a builder for it.
The config tree takes the union of the registered config models, discriminated by ``backend``, so a new backend
needs no other change."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Annotated, Any, Generic, TypeVar, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Tag

log = logging.getLogger(__name__)
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
    # The built object holds event-loop resources (HTTP sessions, tasks), so it is built once per app and closed
    # with it; otherwise it holds only weights and one loaded instance may serve several apps in one process.
    per_app: bool = False


class Registry(Generic[T]):
    """The backends of one kind (detector, ...), in registration order; ``default`` is taken when a config
    section gives no ``backend`` (so ``models.detector.weights`` alone still means the default backend): a name,
    or a function of the section's keys and values that returns one (the detector's depends on the machine).

    A key that no backend of the kind declares is always refused. ``ignore_other_backends_keys``: a key that only
    another backend declares is dropped with a warning instead of refused, for a kind whose section was one flat
    model before its backends were split (``models.llm.api_key`` with the embedded LLM was accepted, unused)."""

    def __init__(self, kind: str, default: str | Callable[[Mapping[str, Any]], str], *,
                 ignore_other_backends_keys: bool = False) -> None:
        self.kind, self._default = kind, default
        self.ignore_other_backends_keys = ignore_other_backends_keys
        self.backends: dict[str, Backend[T]] = {}

    def register(self, config: type[C], *, per_app: bool = False) -> Callable[[Callable[[C], T]], Callable[[C], T]]:
        """Decorate the builder of ``config``'s backend (the name is the default of its ``backend`` field);
        ``per_app``: see ``Backend.per_app``."""
        name = config.model_fields["backend"].default
        if not isinstance(name, str):
            raise TypeError(f"{config.__name__}.backend needs its name as the default")

        def add(build: Callable[[C], T]) -> Callable[[C], T]:
            if name in self.backends:
                raise ValueError(f"{self.kind} backend {name!r} is registered twice")
            self.backends[name] = Backend(name, config, build, per_app)
            return build

        return add

    def build(self, config: BackendConfig) -> T:
        return self.backends[config.backend].build(config)

    def backend(self, config: BackendConfig) -> Backend[T]:
        return self.backends[config.backend]

    def discover(self, package: ModuleType) -> None:
        """Import every module of ``package`` (each registers its backend on import)."""
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")

    def default_for(self, section: Mapping[str, Any]) -> str:
        """The backend a section without ``backend`` means."""
        return self._default if isinstance(self._default, str) else self._default(section)

    @property
    def default(self) -> str:
        """The backend an empty section means."""
        return self.default_for({})

    def default_config(self) -> BackendConfig:
        return self.backends[self.default].config()

    def config_type(self) -> Any:
        """``Annotated[Union[...], Discriminator]`` of the registered configs, for a pydantic field."""

        def which(value: Any) -> str:
            if isinstance(value, dict):
                return value["backend"] if "backend" in value else self.default_for(value)
            return getattr(value, "backend", None) or self.default

        members = tuple(Annotated[b.config, Tag(b.name)] for b in self.backends.values())
        union = Annotated[Union[members], Discriminator(which)]  # noqa: UP007  (a runtime tuple of members)
        if self.ignore_other_backends_keys:
            return Annotated[union, BeforeValidator(self._drop_other_backends_keys)]
        return union

    def _drop_other_backends_keys(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        name = value["backend"] if "backend" in value else self.default_for(value)
        if name not in self.backends:
            return value  # refused by the union, naming the registered backends
        own = set(self.backends[name].config.model_fields)
        others = {key for b in self.backends.values() for key in b.config.model_fields} - own
        dropped = sorted(key for key in value if key in others)
        if dropped:  # key names only: values may be secrets
            log.warning("models.%s: %s not used by backend %r: ignored", self.kind, ", ".join(dropped), name)
        return {key: item for key, item in value.items() if key not in dropped}
