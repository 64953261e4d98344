"""Test seam: a real model whose named blocking methods wait, on the worker thread that calls them, until the test
releases them, so that requests stay in flight exactly as long as a limit test needs (a real model on a loaded
2-core machine finishes after an unknown time). Everything else is the wrapped model's own. Named as a fake on
purpose; never used outside tests."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from typing import Any

HOLD_TIMEOUT_S = 120.0  # a test that fails before releasing must not leave a worker thread waiting forever


class HeldModelForTest:
    def __init__(self, model: Any, methods: Iterable[str], release: threading.Event) -> None:
        self._model = model
        self._methods = frozenset(methods)
        self._release = release

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._model, name)
        if name not in self._methods:
            return attribute

        @functools.wraps(attribute)
        def held(*args: Any, **kwargs: Any) -> Any:
            self._release.wait(HOLD_TIMEOUT_S)
            return attribute(*args, **kwargs)

        return held
