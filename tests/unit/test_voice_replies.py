"""The voice loop's reply rules (pipelines/voice/replies.py): prompt text, reminders, the loop guard."""

from __future__ import annotations

import pytest

from models.llm import ChatMessage
from pipelines.voice import replies


def _guarded(deltas: list[str], max_sentences: int = 3) -> tuple[str, str | None]:
    guard = replies.ReplyGuard(max_sentences)
    out = "".join(guard.push(d) for d in deltas)
    return out + guard.finish(), guard.stopped


def test_a_repeated_sentence_stops_the_reply_and_is_not_let_through():
    out, stopped = _guarded(["I'm", " glad", " you're", " here.", " I'm", " glad", " you're", " here.", " I'm"])
    assert (out.strip(), stopped) == ("I'm glad you're here.", "repeat")


def test_the_first_sentence_streams_and_later_ones_wait_until_whole():
    guard = replies.ReplyGuard(3)
    assert [guard.push(d) for d in ["Paris", " is", " the capital."]] == ["Paris", " is", " the capital."]
    assert [guard.push(d) for d in [" It", " is", " big.", " Yes"]] == ["", "", "", " It is big."]
    assert guard.finish() == " Yes" and guard.stopped is None


def test_a_reply_stops_after_its_sentence_budget():
    out, stopped = _guarded(["One thing.", " Two things.", " Three things.", " Four things."], max_sentences=2)
    assert (out, stopped) == ("One thing. Two things.", "sentences")


def test_a_list_lead_in_and_its_item_headings_are_not_sentences_of_the_budget():
    """Qwen answered "yellow leaves?" with "...healthy. This could involve:\n1. **Ma" and was cut there: the colon
    chunks counted as sentences 2 and 3, so none of the advice was said."""
    deltas = ["Check the plant.", " This could involve:", "\n1. **Soil**:", " Let it drain.", "\n2. **Light**:",
              " Move it to the sun.", " Water less."]
    out, stopped = _guarded(deltas, max_sentences=3)
    assert out == "Check the plant. This could involve:\n1. **Soil**: Let it drain.\n2. **Light**: Move it to the sun."
    assert stopped == "sentences"


def test_markdown_is_not_spoken():
    from pipelines.voice.sentences import speakable

    assert speakable("1. **Light**: move it to a *sunny* spot, `now`.") == "1. Light: move it to a sunny spot, now."
    assert speakable("## Tips\n- Water less\n* Drain well") == "Tips\nWater less\nDrain well"
    assert speakable("3*4 is 12 and my_var stays; 2 * 3 too.") == "3*4 is 12 and my_var stays; 2 * 3 too."


@pytest.mark.parametrize(("said", "kept"), [
    ("Please remind me to buy some milk after work.", "to buy some milk after work"),
    ("Can you remind me to call my mother tomorrow?", "to call your mother tomorrow"),
    ("Remember that my keys are in the car.", "that your keys are in the car"),
    ("Please don't let me forget my umbrella.", "about your umbrella"),
    ("What did I ask you to remember?", None),
    ("I remember the film.", None),
    ("Which planet is closest to the sun?", None),
])
def test_reminder_requests(said: str, kept: str | None):
    assert replies.reminder_request(said) == kept


def test_reminders_are_acknowledged_and_recited():
    assert replies.acknowledge("to buy some milk") == "Okay, I will remind you to buy some milk."
    assert replies.acknowledge("that your keys are in the car") == (
        "Okay, I will remember that your keys are in the car.")
    assert replies.recite(["to buy some milk", "that the code is 42"]) == (
        "You asked me to remind you to buy some milk and remember that the code is 42.")
    assert replies.asks_for_reminders("What did I ask you to remember?")
    assert replies.asks_for_reminders("Do I have any reminders?")
    assert not replies.asks_for_reminders("Remind me to water the plants.")


def _user_message(question: str, *, video: bool, scene: str | None) -> str:
    system = replies.session_prompt("Be brief.", video=video)
    return replies.turn_messages(system, [], question, video=video, scene=scene)[-1].content


def test_the_prompt_names_the_camera_only_with_video_and_the_scene_only_when_asked():
    scene = "The camera sees 2 people."
    assert replies.session_prompt("Be brief.", video=False) == "Be brief."
    assert "camera" in replies.session_prompt("Be brief.", video=True)
    audio_only = replies.turn_messages("Be brief.", [], "How many people do you see?", video=False, scene=None)
    assert "camera" not in " ".join(m.content for m in audio_only)
    assert scene in _user_message("How many people do you see?", video=True, scene=scene)
    assert _user_message("What is twelve times three?", video=True, scene=scene) == "What is twelve times three?"


@pytest.mark.parametrize("question", ["Which car is in the drive?", "Whose van is that?", "Who is at the door?",
                                      "What does the licence plate say?", "Is there a truck outside?"])
def test_who_and_which_questions_get_the_scene(question: str):
    """The scene names recognised people and read plates (video.faces, video.plates): these questions need it."""
    scene = "The camera sees 1 car. Recognised in view: a car with plate AB12CDE (Alice's car)."
    assert _user_message(question, video=True, scene=scene) == f"[Camera: {scene}]\n{question}"


def test_the_scene_spells_out_people_and_says_no_one_when_the_view_is_empty():
    """A small model asked "do you see anyone?" of "sees nothing" answered yes: the count of people comes first."""
    from pipelines.scene import SceneState

    scene = SceneState()
    assert scene.summary() == "The camera has not been analysed yet."
    scene.update(labels=[], pts=1.0, ts=1.0, model="m", zone_occupancy={"door": []}, line_counts={}, events=[])
    assert scene.summary() == "The camera sees no one: 0 people. Nothing is in view. Zone 'door': empty (no one in it)."
    scene.update(labels=["person", "car", "person"], pts=2.0, ts=2.0, model="m", zone_occupancy={"door": [3]},
                 line_counts={}, events=[])
    assert scene.summary() == "The camera sees 2 people, 1 car. Zone 'door': 1 in it."
    scene.update(labels=["dog"], pts=3.0, ts=3.0, model="m", zone_occupancy={}, line_counts={}, events=[])
    assert scene.summary() == "The camera sees no one: 0 people. It sees 1 dog."


def test_memory_searches_for_reminders_when_asked_what_to_remember():
    from pipelines.memory.recall import asks_about_past, rewrite_query

    question = "What did I ask you to remember?"
    assert asks_about_past(question)
    assert rewrite_query(question, []) == "remind remember forget note"  # finds "Please remind me to ..."
    assert rewrite_query("What did I tell you about the bicycle earlier?", []) == "bicycle"


def test_remembered_entries_are_short_and_only_the_relevant_ones_reach_the_prompt():
    """Every token of the remembered entries is read before the reply's first word: today's entries say the time
    only, and an entry no query word matched is kept only among the two nearest by meaning."""
    from datetime import UTC, datetime

    from pipelines.memory.entries import MemoryEntry, SearchHit
    from pipelines.memory.recall import fit_entries, relevant

    now = datetime(2026, 12, 4, 13, 43, 5, tzinfo=UTC).timestamp()
    keys = MemoryEntry("transcript", "I left my keys in the kitchen.", wall_time=now - 180)
    car = MemoryEntry("transcript", "I parked my car on level three.", wall_time=now - 600)
    clara = MemoryEntry("transcript", "My sister's name is Clara.", wall_time=now - 2 * 86400)
    colour = MemoryEntry("transcript", "My favourite colour is green.", wall_time=now - 700)
    hits = [SearchHit(keys, 0.03, keyword_rank=1, vector_rank=1), SearchHit(car, 0.016, vector_rank=2),
            SearchHit(clara, 0.015, vector_rank=3), SearchHit(colour, 0.014, keyword_rank=2, vector_rank=4)]
    assert [hit.entry for hit in relevant(hits)] == [keys, car, colour]
    assert fit_entries([*relevant(hits), hits[2]], 5, 256, now) == [
        '- 13:40 UTC (3 min ago), the user said: "I left my keys in the kitchen."',
        '- 13:33 UTC (10 min ago), the user said: "I parked my car on level three."',
        '- 13:31 UTC (12 min ago), the user said: "My favourite colour is green."',
        '- 2026-12-02 13:43 UTC (2 days ago), the user said: "My sister\'s name is Clara."']


def test_remembered_camera_entries_are_left_out_of_an_audio_only_prompt():
    from pipelines.voice.replies import without_camera

    context = ("What you remember (most relevant first; answer from it and say when):\n"
               "- 2026-12-04 13:40:01 UTC (3 min ago), the user said: \"My sister's name is Clara.\"\n"
               "- 2026-12-04 13:31:12 UTC (12 min ago), the camera saw: person (track 1) left zone 'door'\n"
               "- 2026-12-04 13:30:00 UTC (13 min ago), the camera's view: The camera currently sees 2 persons.")
    kept = without_camera(context).splitlines()
    assert len(kept) == 2 and "Clara" in kept[1]


def test_what_changes_per_turn_follows_the_conversation_so_the_cached_prefix_stays():
    system = replies.session_prompt("Be brief.", video=True)
    history = [ChatMessage("user", "Hello."), ChatMessage("assistant", "Hi.")]
    scene = "The camera currently sees 2 persons."
    recalled = ("What you remember:\n- 2026-12-04 13:40:01 UTC (3 min ago), the user said: \"My car is blue.\"\n"
                "- 2026-12-04 13:31:12 UTC (12 min ago), the camera saw: person (track 1) left zone 'door'")
    asked = replies.turn_messages(system, history, "How many people do you see?", video=True, scene=scene,
                                  recalled=recalled)
    assert asked[:3] == [ChatMessage("system", system), *history]  # the same prefix as the turn before
    assert asked[3:] == [ChatMessage("system", recalled),
                         ChatMessage("user", f"[Camera: {scene}]\nHow many people do you see?")]
    plain = replies.turn_messages(system, history, "What is twelve times three?", video=True, scene=scene)
    assert plain == [ChatMessage("system", system), *history, ChatMessage("user", "What is twelve times three?")]
    audio_only = replies.turn_messages(replies.session_prompt("Be brief.", video=False), [],
                                       "What colour did I say my car was?", video=False, scene=None, recalled=recalled)
    assert "blue" in audio_only[1].content and "camera" not in audio_only[1].content
