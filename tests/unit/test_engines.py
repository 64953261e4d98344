"""Who owns the models: an app's ``Engines`` builds each model once and closes it; loaded weights live in a
``ModelPool`` that is the app's own unless one is handed in (the test suite hands one to every app); backends
that hold event-loop resources (the LLM router) are never pooled. No model is loaded here."""

from __future__ import annotations

from typing import Literal

from models.registry import BackendConfig, Registry
from server.config import load_settings
from server.engines import Engines, ModelPool


class ClosableForTest:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class SizeConfigForTest(BackendConfig):
    backend: Literal["sized"] = "sized"
    size: int = 1


def test_a_pool_loads_each_model_once_per_config():
    registry: Registry[list[int]] = Registry("thing", default="sized")
    loads: list[int] = []

    @registry.register(SizeConfigForTest)
    def build(config: SizeConfigForTest) -> list[int]:
        loads.append(config.size)
        return [config.size]

    pool = ModelPool()
    small = pool.backend(registry, SizeConfigForTest(size=1))
    assert pool.backend(registry, SizeConfigForTest(size=1)) is small
    assert pool.backend(registry, SizeConfigForTest(size=2)) == [2]
    assert loads == [1, 2]


async def test_the_pool_closes_what_it_loaded():
    pool = ModelPool()
    model = pool.get(("closable",), ClosableForTest)
    await pool.close()
    assert model.closed
    assert pool.get(("closable",), ClosableForTest) is not model  # closed models are never handed out again


async def test_an_app_closes_its_own_pool_but_not_one_handed_to_it():
    settings = load_settings(None, {"voice": {"enabled": False}, "models": {"detector": {"backend": "none"}}})
    own = Engines(settings)
    own_model = own.models.get(("closable",), ClosableForTest)
    await own.close()
    assert own_model.closed
    shared = ModelPool()
    shared_model = shared.get(("closable",), ClosableForTest)
    await Engines(settings, models=shared).close()
    assert not shared_model.closed


async def test_the_router_is_built_per_app_and_shared_within_it():
    settings = load_settings(None, {"voice": {"enabled": False}, "models": {
        "detector": {"backend": "none"}, "llm": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1"}}})
    pool = ModelPool()
    first, second = Engines(settings, models=pool), Engines(settings, models=pool)
    router = first.llm()
    assert first.llm() is router  # the voice loop, the chat service and gRPC of one app share it
    assert second.llm() is not router  # it holds HTTP sessions on its app's loop: never shared between apps
    await first.close()
    await second.close()
