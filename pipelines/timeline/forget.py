"""Forgetting a person (``DELETE /api/faces/{name}``): their name taken out of what the timeline wrote.

An event or alert keeps what happened (a person entered zone 'door', its clip and snapshot) and loses its
``identity`` (the name and its score): it reads as it would had the person never been enrolled. A text that names
them (an alert's "Barack is at the door", a reply, a transcript) says ``someone`` instead, the word an alert uses for
a face that matches nobody. Only the exact name, as a whole word and with its case, is replaced: forgetting "Will"
leaves "will" alone.
"""

from __future__ import annotations

import re
from typing import Any

ANONYMOUS = "someone"


def without_identity(value: Any, name: str) -> tuple[Any, bool]:
    """``value`` (an entry's data, JSON-like) with every ``identity`` naming ``name`` removed, at any depth, and
    whether there was one. Copies only what changes: the value given is never modified (it may be in use)."""
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "identity" and isinstance(item, dict) and item.get("name") == name:
                changed = True
                continue
            item, item_changed = without_identity(item, name)
            changed |= item_changed
            out[key] = item
        return (out, True) if changed else (value, False)
    if isinstance(value, list):
        items = [without_identity(item, name) for item in value]
        if any(changed for _, changed in items):
            return [item for item, _ in items], True
        return value, False
    return value, False


def without_name(text: str | None, name: str) -> tuple[str | None, bool]:
    """``text`` with ``name`` (a whole word, its case) replaced by ``someone``, and whether it was there."""
    if not text or name not in text:
        return text, False
    replaced, count = re.subn(rf"(?<!\w){re.escape(name)}(?!\w)", ANONYMOUS, text)
    return replaced, count > 0


def anonymise(entry: Any, name: str) -> tuple[bool, bool]:
    """Take ``name`` out of a timeline entry's data and text (new objects: the old ones may be in use elsewhere).
    Returns (an identity was removed, the text changed)."""
    data, identity = without_identity(entry.data, name)
    text, named = without_name(entry.text, name)
    entry.data, entry.text = data, text
    return identity, named
