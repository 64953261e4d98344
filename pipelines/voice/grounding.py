"""Grounding: the first word of a yes-or-no question about people in view, taken from the detector rather than
left to the LLM. Qwen2.5 0.5B answers "Yes, I can see someone!" to "Do you see anyone?" of an empty view, with the
scene line saying "The camera sees no one: 0 people" in front of the question (docs/llm.md has the forms of that
line tried). A security camera's voice must not contradict its own events, so when the scene settles the answer
the reply starts with it ("No,") and the LLM goes on from there (an assistant message it continues).

Rule-based and narrow on purpose, like ``pipelines.voice.replies``: a lead is given only where the counts decide
it, and any other question goes to the LLM as before:
- only a plain question of presence: every word from a short list or a zone's name ("Is anyone in the door
  zone?"). "Is anyone wearing a hat?", "Can you tell me how many people are here?" and "Can anyone see me?" are
  the LLM's;
- "Yes," or "No," by the people the camera counts, or those in the zone named. A zone's tracks are of any label,
  so its "Yes," needs every counted object to be a person;
- "Is the room (or a zone) empty?": "Yes," when nothing at all is counted there; "No," when something is (in the
  room, when someone is: a parked car does not make a room "not empty" to most askers).
Questions in the past, negated ones ("Isn't anyone there?"), two-part ones ("anyone or anything?") and those
naming two zones get no lead."""

from __future__ import annotations

import re

from pipelines.scene import SceneState

_YES_NO = re.compile(r"^(is|are|do|does|can|could)\b", re.IGNORECASE)
_PEOPLE = re.compile(r"\b(anyone|anybody|someone|somebody|people|persons?)\b(?!['’])", re.IGNORECASE)
# Negated or about another time: "is nobody there?", "was anyone here earlier?", "has anyone been here?"
_NOT_NOW = re.compile(r"n't\b|\b(not|no|nobody|none|never|was|were|did|had|has|have|been|earlier|before|ago|"
                      r"yesterday|today|tonight|last|will|going|later)\b", re.IGNORECASE)
# "Is anyone or anything there?", "any people and cars?": the people's count alone does not decide it.
_COMPOUND = re.compile(r"\b(or|and)\b", re.IGNORECASE)
_OPENING = re.compile(r"^(and|so|ok|okay|well|now|then|also)\b[, ]*", re.IGNORECASE)  # "And is anyone there?"
# "Is the room empty?", "is the door zone empty right now?" (not "clear": "is the picture clear?" asks of its focus)
_EMPTY = re.compile(r"^(is|are) (the )?(?P<place>[\w' ]+?) empty( (right )?now| at the moment)?$", re.IGNORECASE)
_PLACES = frozenset({"room", "view", "scene", "picture", "area", "place", "camera view", "image", "frame"})
# A plain question of presence: nothing in it but these words and a zone's name.
_PRESENCE_WORDS = frozenset(
    "is are do does can could you see there here anyone anybody someone somebody any people person persons a the "
    "in at of front camera view sight visible present around zone area room right now by near picture image video "
    "frame scene".split())


def answer_lead(question: str, scene: SceneState | None) -> str | None:
    """The reply's first word ("Yes," or "No,") when ``scene`` decides the answer to ``question``, else None."""
    if scene is None or scene.pts is None:
        return None  # not analysed yet: the counts say nothing
    words = _OPENING.sub("", question.strip().rstrip("?!. ").strip())
    if not _YES_NO.match(words) or _NOT_NOW.search(words) or _COMPOUND.search(words):
        return None
    zones = [zone for zone in scene.zone_occupancy if _names(words, zone)]
    if len(zones) > 1:
        return None
    zone_words = set(zones[0].lower().split()) if zones else set()
    if not all(word in _PRESENCE_WORDS or word in zone_words for word in re.findall(r"[\w'’]+", words.lower())):
        if (empty := _EMPTY.match(words)) is None:
            return None
        place = empty["place"].lower().removesuffix(" zone")
        if zones and place == zones[0].lower():
            return "No," if scene.zone_occupancy[zones[0]] else "Yes,"
        if place in _PLACES and not zones:
            return "No," if scene.counts.get("person", 0) else "Yes," if not scene.counts else None
        return None
    if not _PEOPLE.search(words):
        return None
    if not zones:
        return "Yes," if scene.counts.get("person", 0) else "No,"
    if not scene.zone_occupancy[zones[0]]:
        return "No,"
    return "Yes," if set(scene.counts) == {"person"} else None  # else its tracks may be a car's


def _names(words: str, zone: str) -> bool:
    """Whether the question names ``zone``; one called like a word of presence ("front", "room") only as "the
    front zone", so that "in front of the camera" stays a question about the whole view."""
    name = re.escape(zone)
    plain = zone.lower() not in _PRESENCE_WORDS and zone.lower() not in _PLACES
    return re.search(rf"\b{name}\b" if plain else rf"\b{name} zone\b", words, re.IGNORECASE) is not None
