"""bench/turn_ends.py's counting: a turn ends on the model's score and the voice loop's words check, and the
re-check table counts only what the default check left open."""

from __future__ import annotations

from bench.turn_ends import Resumed, Spoken, ends, report, report_resumed
from pipelines.voice.config import VoiceLoopOptions


def test_a_fragment_ends_on_its_score_unless_its_words_sound_unfinished():
    assert ends(Spoken("What is the capital", False, {200: 0.9}), 200, 0.5)
    assert not ends(Spoken("What is the", False, {200: 0.99}), 200, 0.5)  # ends on an article
    assert not ends(Spoken("What is the capital", False, {200: 0.4}), 200, 0.5)
    assert not ends(Spoken("What is the capital", False, {}), 200, 0.5)  # the VAD never opened a turn


def test_the_recheck_table_counts_what_the_default_check_left_open(capsys):
    heard = [
        Spoken("What colour is the sky?", True, {200: 0.9, 600: 0.9}),  # ended at once
        Spoken("I have a headache.", True, {200: 0.1, 600: 0.8}),  # capped today, ended by a re-check
        Spoken("How can I stay cool?", True, {200: 0.1, 600: 0.2}),  # capped either way
        Spoken("Could you tell me what the weather will be like", False, {200: 0.05, 600: 0.8}),  # cut by it
        Spoken("How many legs", False, {200: 0.9, 600: 0.9}),  # cut by the default check already
    ]
    report(heard, [200, 600], [0.5], VoiceLoopOptions())
    out = capsys.readouterr().out
    assert "3 whole questions, 2 cut between words" in out
    assert "     200       0.50       1/3  33 %         1/2  50 %" in out
    assert "     600       0.50       2/3  67 %         2/2 100 %" in out
    assert "     600       0.50              +1             1           +1 of 1" in out
    assert "leaves to the cap: 'I have a headache.', 'How can I stay cool?'" in out


def test_the_resumed_table_counts_each_shortening_and_the_words_check(capsys):
    heard = [
        Resumed("Could you tell me what the weather will be like tomorrow?", True,
                {None: 0.1, 300: 0.9}),  # ended only with its pause shortened
        Resumed("How many legs does a spider have?", True, {None: 0.8, 300: 0.9}),  # ended either way
        Resumed("Could you tell me what the", False, {None: 0.2, 300: 0.99}),  # ends on an article
        Resumed("Could you tell me what the weather", False, {None: 0.2, 300: 0.7}),  # cut off
        Resumed("What is the capital", False, {}),  # the VAD never opened a turn: not counted
    ]
    report_resumed(heard, 1000, [None, 300], VoiceLoopOptions())
    out = capsys.readouterr().out
    assert "a question paused 1000 ms mid-sentence" in out
    assert "      as heard       1/2  50 %         0/2   0 %" in out
    assert "     <= 300 ms       2/2 100 %         1/2  50 %" in out
    assert "left to the cap with the pause as heard: 1, e.g. 'Could you tell me what the weather will be like " \
        "tomorrow?'" in out
