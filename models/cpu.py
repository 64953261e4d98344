"""How many CPU threads a model gets when its config does not say. On the small machines Vigil targets, the voice
loop's models run side by side on the same cores (the LLM generates while Piper synthesises the next chunk), so
each of those two takes half of them: a thread pool that shares its cores spins and loses to the other."""

from __future__ import annotations

import os


def cores() -> int:
    return os.cpu_count() or 1


def half_the_cores() -> int:
    return max(1, cores() // 2)
