"""What the voice loop says, as opposed to how fast: the turn's prompt says only what the session has (no camera
text without a video track, scene facts only when the question is about the scene), reminders are acknowledged
and kept, and a streamed reply is stopped when it repeats a sentence or runs past a few sentences.

Rule-based on purpose, like memory recall (``pipelines.memory.recall``): a small LLM repeats whatever its prompt
says ("The camera has not been analysed yet." in an audio-only session) and loops one sentence until the token
limit, and a rule costs microseconds on every turn."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from models.llm import ChatMessage
from pipelines.voice.sentences import ends_sentence, split_sentences

# Questions the camera can answer: what is seen, who is where, what happened in view.
_SCENE = re.compile(
    r"\b(camera|cameras|see|sees|seeing|saw|seen|look|looks|looking|watch|watching|view|visible|video|picture|"
    r"image|scene|room|people|person|persons|anyone|anybody|someone|somebody|nobody|who|zone|zones|line|lines|"
    r"crossed|crossing|in front|inside|entered|entering|left|here|around|there|count|counted|"
    # who and which (video.faces, video.plates): "which car is in the drive?", "whose van is that?" (not "car"
    # alone: "where did I say I parked my car?" is about the past)
    r"vehicle|vehicles|van|truck|bus|plate|plates|licence|license|whose|drive|driveway|door|outside)\b",
    re.IGNORECASE,
)
# "Remind me to buy milk", "please remember that the code is 42", "don't let me forget the keys".
_REMINDER = re.compile(
    r"\b(?P<verb>remind me|remember|(?:do not|don't) let me forget|make a note|note)\s+(?P<how>to|that|about|of)?\s*"
    r"(?P<what>.+)",
    re.IGNORECASE,
)
# A question about what was asked to be remembered (not a new request).
_RECALL_REMINDERS = re.compile(
    r"\b(what|which|any|did i|do i|have i|tell me|list)\b.*\b(remind|reminders?|remember|note|notes)\b",
    re.IGNORECASE,
)
_FIRST_TO_SECOND = {"me": "you", "my": "your", "mine": "yours", "i": "you", "i'm": "you're", "myself": "yourself",
                    "am": "are", "i've": "you've", "i'll": "you'll"}
_SENTENCE_KEY = re.compile(r"[^a-z0-9 ]")
_CAMERA_ENTRY = re.compile(r"^- .*\), (the camera saw|the camera's view):")


def has_video(tracks: list[str]) -> bool:
    return "video" in tracks


def about_scene(question: str) -> bool:
    """Whether the scene summary helps answer ``question`` (else it only tempts a small model to talk of it)."""
    return _SCENE.search(question) is not None


def reminder_request(text: str) -> str | None:
    """What the user asks to be reminded of, as the words after "remind you" / "remember" in the second person
    ("to buy some milk after work", "that your keys are in the car"), or None."""
    if _RECALL_REMINDERS.search(text) and "?" in text:
        return None  # "what did I ask you to remember?" asks, it does not request
    match = _REMINDER.search(text)
    if match is None or (match["how"] is None and match["verb"].lower() in ("remember", "note", "make a note")):
        return None  # "I remember the film" is no request
    what = " ".join(_FIRST_TO_SECOND.get(word.lower(), word) for word in match["what"].rstrip(".!? ").split())
    if not what:
        return None
    how = (match["how"] or "about").lower()
    return f"{'about' if how == 'of' else how} {what}"


def asks_for_reminders(text: str) -> bool:
    return reminder_request(text) is None and _RECALL_REMINDERS.search(text) is not None


def _verb(reminder: str) -> str:
    return f"remind you {reminder}" if reminder.startswith(("to ", "about ")) else f"remember {reminder}"


def acknowledge(reminder: str) -> str:
    return f"Okay, I will {_verb(reminder)}."


def recite(reminders: list[str]) -> str:
    """The answer to "what did I ask you to remember?" from this session's reminders."""
    said = [_verb(r) for r in reminders]
    return "You asked me to " + (said[0] if len(said) == 1 else ", ".join(said[:-1]) + f" and {said[-1]}") + "."


def session_prompt(base: str, *, video: bool) -> str:
    """The session's stable system prompt: ``base`` (the config's), and the camera only when the session has a
    video track (the scene itself goes with the question: ``turn_messages``)."""
    parts = [base.strip()]
    if video:
        parts.append("You can see through the user's camera.")
    return "\n\n".join(parts)


def turn_messages(system: str, history: Sequence[ChatMessage], question: str, *, video: bool,
                  scene: str | None = None, recalled: str | None = None, lead: str | None = None) -> list[ChatMessage]:
    """The turn's prompt in an order llama.cpp can reuse. It keeps the KV cache of the longest prefix a request
    shares with the one before, so the session's stable system prompt (``session_prompt``) and the conversation
    so far come first and are not evaluated again; what changes from turn to turn follows them: entries recalled
    from memory as a system message (camera entries only with a video track or a question about what was seen:
    otherwise they lead a small model to speak of a camera the session does not have), then the question, with
    the scene in front of it when the question is about it (a video session), and with the scene the reply's
    first word when the scene decides it (``lead``, ``pipelines.voice.grounding``): an assistant message the LLM
    goes on from."""
    messages = [ChatMessage("system", system), *history]
    if recalled:
        messages.append(ChatMessage("system", recalled if video or about_scene(question) else without_camera(recalled)))
    if video and scene is not None and about_scene(question):
        # In the user's own message: a 0.5B model answers "yes, I see someone" of an empty view when the scene
        # is a system message before the question, and reads it when it stands in the question (bench/answers.py)
        question = f"[Camera: {scene}]\n{question}"
        if lead:
            return [*messages, ChatMessage("user", question), ChatMessage("assistant", lead)]
    return [*messages, ChatMessage("user", question)]


def without_camera(context: str) -> str:
    """Remembered entries (``pipelines.memory.recall`` lines) without those a camera made."""
    return "\n".join(line for line in context.splitlines() if not _CAMERA_ENTRY.search(line))


def _key(sentence: str) -> str:
    return " ".join(_SENTENCE_KEY.sub("", sentence.lower()).split())


@dataclass
class ReplyGuard:
    """Lets a streamed reply through sentence by sentence and stops it at a sentence it already said (a loop) or
    after ``max_sentences``. The first sentence streams as it comes (nothing to repeat yet, and its first clause
    is spoken at once); each later one is held until it is complete and known not to repeat one before it.

    ``push(delta)`` returns the text that may be shown and spoken now; ``finish()`` what is left when the stream
    ends; ``stopped`` says why it was cut ("repeat" or "sentences"), and the caller stops generating."""

    max_sentences: int = 3
    stopped: str | None = None
    text: str = ""  # everything generated
    _released: int = 0  # text[:_released] has been let through
    _done: int = 0  # text[:_done] is whole sentences, checked
    _sentences: int = 0
    _seen: set[str] = field(default_factory=set)

    def push(self, delta: str) -> str:
        if self.stopped is not None:
            return ""
        self.text += delta
        self._check(final=False)
        return self._release()

    def finish(self) -> str:
        if self.stopped is None:
            self._check(final=True)
        return self._release()

    def _check(self, *, final: bool) -> None:
        buffer = self.text[self._done:]
        sentences, _ = split_sentences(buffer, final=final)
        position = self._done
        for sentence in sentences:
            start = self.text.index(sentence, position)
            key = _key(sentence)
            if key and key in self._seen:
                self.stopped, self._done = "repeat", start
                return
            self._seen.add(key)
            if ends_sentence(sentence):  # "This could involve:" and a list's "**Light**:" are not sentences
                self._sentences += 1
            position = self._done = start + len(sentence)
            if self._sentences >= self.max_sentences and not final:
                self.stopped = "sentences"
                return

    def _release(self) -> str:
        streaming_first = self.stopped is None and self._sentences == 0
        limit = max(len(self.text) if streaming_first else self._done, self._released)
        out, self._released = self.text[self._released:limit], limit
        return out
