"""Language-model backends (``models.llm.LanguageModel``), one module each, declaring its config and registering
its builder with ``LANGUAGE_MODELS``; every module here is loaded on import. Every backend's config has
``model``: the model name clients ask for."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from models.registry import Registry

if TYPE_CHECKING:
    from models.llm import LanguageModel

# The config tree loads this package: the backends import their libraries (aiohttp, xllamacpp) when they build.
# One flat section before the split: a key of the other backend (e.g. api_key with the embedded LLM) is ignored.
LANGUAGE_MODELS: Registry[LanguageModel] = Registry("llm", default="embedded", ignore_other_backends_keys=True)

LANGUAGE_MODELS.discover(sys.modules[__name__])
