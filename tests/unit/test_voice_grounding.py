"""A reply's first word from the detector's counts (pipelines/voice/grounding.py) and where it goes in the prompt."""

from __future__ import annotations

import pytest

from models.llm import ChatMessage
from pipelines.scene import SceneState
from pipelines.voice import replies
from pipelines.voice.grounding import answer_lead
from pipelines.voice.streaming import after_lead


def _scene(people: int, in_door: int, *, cars: int = 0, zones: tuple[str, ...] = ()) -> SceneState:
    """``in_door`` tracks in zone "door" (of the ``people``, or a car when there are none); zone "back yard" and
    any other ``zones`` empty."""
    scene = SceneState()
    occupancy = {"door": list(range(in_door)), "back yard": [], **{zone: [] for zone in zones}}
    scene.update(labels=["person"] * people + ["car"] * cars, pts=1.0, ts=1.0, model="yolo",
                 zone_occupancy=occupancy, line_counts={}, events=[])
    return scene


# (question, lead with 2 people of whom 1 in the door zone, with no one, with 1 person outside the door zone)
LEADS = [
    ("Do you see anyone?", "Yes,", "No,", "Yes,"),
    ("Is anyone in front of the camera?", "Yes,", "No,", "Yes,"),
    ("Are there any people in view?", "Yes,", "No,", "Yes,"),
    ("can you see a person", "Yes,", "No,", "Yes,"),
    ("Is somebody there?", "Yes,", "No,", "Yes,"),
    ("Is anybody in the door zone?", "Yes,", "No,", "No,"),
    ("Is someone at the door?", "Yes,", "No,", "No,"),
    ("Is anyone in the back yard?", "No,", "No,", "No,"),
    ("Is the room empty?", "No,", "Yes,", "No,"),
    ("Is the door zone empty?", "No,", "Yes,", "Yes,"),
    ("Is the room empty at the moment?", "No,", "Yes,", "No,"),
    # Someone in view does not make these yes: a qualifier only the LLM can judge, or no zone of that name.
    ("Is anyone wearing a red hat?", None, None, None),
    ("Can you see people in the kitchen?", None, None, None),
    ("Can you tell me how many people are here?", None, None, None),
    ("Can anyone see me?", None, None, None),
    ("Can you see someone's car?", None, None, None),
    ("Is the picture clear?", None, None, None),
    # Not about who is in view now: counts, people in general, other times, negations, other things empty.
    ("How many people do you see?", None, None, None),
    ("Do people like cats?", None, None, None),
    ("Was anyone here earlier?", None, None, None),
    ("Has anybody been in the door zone?", None, None, None),
    ("Isn't anyone there?", None, None, None),
    ("Is nobody there?", None, None, None),
    ("Is the fridge empty?", None, None, None),
    ("Is anyone in the door zone or the back yard?", None, None, None),
    ("Do you see any people or cars?", None, None, None),
    ("And is anyone in the picture?", "Yes,", "No,", "Yes,"),
    ("What is twelve times three?", None, None, None),
]


@pytest.mark.parametrize(("question", "two", "none", "one_outside"), LEADS)
def test_the_counts_decide_yes_or_no(question: str, two: str | None, none: str | None, one_outside: str | None):
    assert [answer_lead(question, _scene(*counts)) for counts in ((2, 1), (0, 0), (1, 0))] == [two, none, one_outside]


def test_a_zone_says_yes_only_when_everything_counted_is_a_person():
    """A zone's tracks are of any label: a car parked in it is no one at the door."""
    car_at_door = _scene(0, 1, cars=1)
    assert answer_lead("Is anyone in the door zone?", car_at_door) is None
    assert answer_lead("Do you see anyone?", car_at_door) == "No,"
    assert answer_lead("Is the door zone empty?", car_at_door) == "No,"  # something is in it
    assert answer_lead("Is the room empty?", car_at_door) is None  # no one, but not nothing
    assert answer_lead("Is anyone in the door zone?", _scene(2, 1, cars=1)) is None
    assert answer_lead("Is anyone in the back yard?", car_at_door) == "No,"  # nothing at all in it


def test_a_zone_named_like_a_word_of_presence_is_named_only_as_a_zone():
    front = _scene(2, 0, zones=("front",))
    assert answer_lead("Is anyone in front of the camera?", front) == "Yes,"
    assert answer_lead("Is anyone in the front zone?", front) == "No,"


def test_no_lead_before_the_camera_is_analysed_or_without_one():
    assert answer_lead("Do you see anyone?", SceneState()) is None
    assert answer_lead("Do you see anyone?", None) is None


def test_the_lead_follows_the_question_only_with_the_scene_in_it():
    system = replies.session_prompt("Be brief.", video=True)
    scene = _scene(0, 0).summary()
    asked = replies.turn_messages(system, [], "Do you see anyone?", video=True, scene=scene, lead="No,")
    assert asked[1:] == [ChatMessage("user", f"[Camera: {scene}]\nDo you see anyone?"), ChatMessage("assistant", "No,")]
    # Without the scene line the LLM would go on from a word it has no reason for: no lead.
    audio_only = replies.turn_messages(replies.session_prompt("Be brief.", video=False), [], "Do you see anyone?",
                                       video=False, scene=None, lead="No,")
    assert [m.role for m in audio_only] == ["system", "user"]


async def _spoken(lead: str, deltas: list[str]) -> list[str]:
    async def stream():
        for delta in deltas:
            yield delta

    return [delta async for delta in after_lead(lead, stream())]


async def test_the_lead_goes_out_with_the_first_token():
    assert await _spoken("No,", [" I", " don't", " see", " anyone."]) == ["No, I", " don't", " see", " anyone."]
    assert await _spoken("No,", ["I don't."]) == ["No, I don't."]  # a space where the LLM gave none
    assert await _spoken("Yes,", []) == ["Yes,"]  # the LLM stopped at once: the lead is the reply
    assert await _spoken("", ["Paris."]) == ["Paris."]
