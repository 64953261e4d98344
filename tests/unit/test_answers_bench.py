"""bench/answers.py's grading: the question set, loops, camera talk in an audio-only session, transcripts."""

from __future__ import annotations

import re

import pytest

from bench.answers import CATEGORIES, CONVERSATIONS, Conversation, Q, grade, loops, transcript_matches
from bench.voice import Turn


def test_the_question_set_covers_every_category_with_sixty_graded_questions():
    graded = [q for c in CONVERSATIONS for q in c.questions if q.category]
    assert len(graded) >= 60
    assert {q.category for q in graded} == set(CATEGORIES)
    for q in graded:  # saying the question back is no right answer (a request is acknowledged in its words)
        assert q.category == "requests" or not re.search(q.accept, q.text, re.IGNORECASE), q
    assert any(not c.audio_only for c in CONVERSATIONS)


def _graded(reply: str, question: Q, clip: str | None = None):
    turn = Turn("vigil", question.text, replies=[reply], answered=[question.text])
    return grade("vigil", question, Conversation((question,), clip=clip), 0, turn)


def test_grades():
    sun = Q("Which planet is closest to the sun?", "facts", r"mercury")
    assert _graded("Mercury is.", sun).right
    assert _graded("The planet closest to the sun is Venus.", sun).why == "lacks /mercury/"
    camera = _graded("The camera has not been analysed yet. Mercury.", sun)
    assert (camera.right, camera.absent) == (False, True)
    assert _graded("I see two people.", Q("How many people do you see?", "scene", r"two"), clip="two-people").right
    empty_view = next(c for c in CONVERSATIONS if c.clip == "no-one").questions[1]  # "How many people do you see?"
    assert all(_graded(reply, empty_view, clip="no-one").right for reply in ("I see 0 people.", "I can't see anyone."))
    assert not _graded("I see two people.", empty_view, clip="no-one").right
    looped = _graded("Mercury is hot. Mercury is hot.", sun)
    assert (looped.right, looped.looped) == (False, True)


def test_loops_and_transcripts():
    assert loops("a b c d e f, a b c d e f, a b c d e f")
    assert not loops("Paris is the capital of France. It is big.")
    assert transcript_matches("Who wrote Romeo and Juliet?", "who wrote Romeo and Juliet")
    assert not transcript_matches("What colour is a ripe banana?", "What colors a bright banana?")


def test_a_turn_shows_vigils_stages_and_a_misheard_earlier_turn_explains_a_wrong_answer(capsys):
    from bench.answers import report, server_stages

    metrics = [{"turn": 2, "end_of_turn": "model", "memory_retrieval_ms": 31.5, "memory_entries": 2,
                "llm_first_token_ms": 952.2, "voice_to_voice_ms": 1420.0}]
    assert server_stages(metrics) == "ended by model, memory ms 31.5, entries 2, first token ms 952.2"
    assert server_stages([{"turn": 1, "end_of_turn": "model"}]) == ""  # no reply audio: not the reply's stages
    said, asked = Q("My sister's name is Clara."), Q("What did I tell you my sister's name is?", "past", r"clara")
    conversation = Conversation((said, asked))
    results = []
    for question, heard, reply in ((said, "My sister's name is Clark.", "Clark is your sister's name."),
                                   (asked, asked.text, "You told me your sister's name is Clark.")):
        turn = Turn("vigil", question.text, replies=[reply], answered=[heard])
        results.append(grade("vigil", question, conversation, 0, turn))
    assert not results[1].right
    report(results, ["vigil"])
    assert "of 1 wrong answers 1 followed a transcript that differs from what was said" in capsys.readouterr().out


def test_a_served_set_up_can_change_the_config_beside_the_default():
    from bench.voice import served_config

    base = {"video": {"zones": [{"name": "door"}]}}
    changed = served_config("qwen2.5-0.5b@base,voice.scene_lead=false,voice.max_reply_sentences=2", base)
    assert changed == {"video": {"zones": [{"name": "door"}]}, "voice": {"scene_lead": False, "max_reply_sentences": 2},
                       "models": {"llm": {"weights": "qwen2.5-0.5b"}, "stt": {"model_dir": "base"}}}
    assert base == {"video": {"zones": [{"name": "door"}]}}  # each set-up its own copy
    assert served_config("/models/a,b.gguf,voice.scene_lead=false", base)["models"]["llm"] == {
        "model_path": "/models/a,b.gguf"}
    with pytest.raises(SystemExit, match=r"section\.key=value"):
        served_config("qwen2.5-0.5b,voice.scene_lead", base)


def test_the_scene_questions_bench_takes_the_spoken_ones_and_holds_others_out():
    from bench.scene_questions import HELD_OUT, bench_conversations

    spoken = [(state.summary(), [q.text for q in asked]) for state, asked in bench_conversations()]
    assert [texts for _, texts in spoken] == [[q.text for q in c.questions] for c in CONVERSATIONS if c.clip]
    assert "2 people" in spoken[0][0] and "no one" in spoken[1][0]
    held = {q.text for _, asked in HELD_OUT for q in asked}
    assert len(held) == 12 and not held & {q.text for c in CONVERSATIONS for q in c.questions}
