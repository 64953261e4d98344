"""Sentence splitting for streamed LLM text: the voice loop speaks a reply one sentence at a time, cut from the
stream by :func:`split_sentences` (the first chunk by :func:`split_first_clause`, so that speaking starts after
the first clause rather than the whole first sentence); ``/v1/audio/speech`` synthesises long input the same
way."""

from __future__ import annotations

import re

# Words that end with a period without ending the sentence (compared lower-case, without the period).
_ABBREVIATIONS = frozenset(
    "mr mrs ms mx dr prof sr jr st mt vs approx dept est fig gen gov sgt capt col lt rev hon cf ca".split()
)
# A run of terminators (with closing quotes/brackets) followed by whitespace or the end, or a newline.
_BOUNDARY = re.compile(r"[.!?;:…]+[\"'”’)\]]*(?=\s|$)|\n")
_LAST_WORD = re.compile(r"(\S+)$")
_ACRONYM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")  # "e.g", "i.e", "U.S" (final period excluded)
_LIST_NUMBER = re.compile(r"\d+\.")
# Markdown a small model writes despite the prompt: emphasis, code ticks, headings and bullets.
_MARKUP = re.compile(r"\*\*|__|(?<!\w)[*_](?=\w)|(?<=\w)[*_](?!\w)|`+|^[ \t]{0,3}#{1,6}[ \t]+|^[ \t]*[-*•][ \t]+",
                     re.MULTILINE)
# A chunk that ends a sentence (not a clause before a colon or semicolon, a list's lead-in, a line).
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*$")


def speakable(text: str) -> str:
    """What the voice says of a chunk of reply text: without markdown (Piper reads "**Light**" as "asterisk
    asterisk light asterisk asterisk", 3.5 s instead of 1). The text a client is sent keeps it."""
    return _MARKUP.sub("", text)


def ends_sentence(chunk: str) -> bool:
    return _SENTENCE_END.search(chunk.rstrip()) is not None


def split_sentences(buffer: str, final: bool = False) -> tuple[list[str], str]:
    """Cut complete sentences off the front of streamed text: (sentences, remaining tail).

    A sentence ends at ``. ! ? ; : …`` (repeats and closing quotes/brackets included) followed by whitespace,
    or at a newline. Not at decimals ("3.5"), times ("10:30"), abbreviations ("Mr.", "e.g.", "U.S."),
    initials ("J. Smith") or list numbers ("1. "). A terminator at the very end of the buffer is not a boundary
    yet — the next token may continue it ("3." then "5") — unless ``final`` (the stream has ended), in which
    case the whole buffer is returned as sentences and the tail is empty. Usage::

        tail = ""
        for token in llm_stream:
            sentences, tail = split_sentences(tail + token)
            speak(sentences)
        speak(split_sentences(tail, final=True)[0])

    Sentences are stripped and never empty; the tail keeps its trailing whitespace so appending works.
    """
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(buffer):
        end = match.end()
        if match.group() != "\n":
            if end == len(buffer) and not final:
                break
            if match.group() == "." and _is_abbreviation(buffer[start : match.start()]):
                continue
            if _LIST_NUMBER.fullmatch(buffer[start:end].strip()):
                continue
        sentence = buffer[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = end
    tail = buffer[start:].lstrip()
    if final:
        if tail.strip():
            sentences.append(tail.strip())
        tail = ""
    return sentences, tail


def _is_abbreviation(before_period: str) -> bool:
    match = _LAST_WORD.search(before_period)
    if match is None:
        return False
    word = match.group(1).lstrip("\"'“‘([")
    if word.lower() in _ABBREVIATIONS or _ACRONYM.fullmatch(word):
        return True
    return len(word) == 1 and word.isupper()  # an initial: "J. Smith"


# A clause ends at a comma, semicolon, colon or dash followed by whitespace.
_CLAUSE = re.compile(r"(?:[,;:]|\s[-–—]|[–—])[\"'”’)\]]*(?=\s)")
FIRST_CLAUSE_MIN_WORDS = 3  # shorter first chunks leave a gap while the next one is synthesised
# With no punctuation by then, cut at a word boundary: 6 words, not 10, brought the first reply audio ~30 % sooner
# on a long first sentence (fewer tokens to wait for, a shorter chunk to synthesise); the cut sounds like a comma.
# 4, not 6, with Qwen 0.5B (~30 tokens/s on one thread): heard 0.82 x as late (bench/voice.py, one run, 10 turns);
# 3, not 4: 0.85 x and 0.97 x as late in two A/B runs (10 turns each), the cut now followed by a 40 ms pause.
FIRST_CHUNK_MAX_WORDS = 3


def split_first_clause(buffer: str, final: bool = False, *,
                       cut_words: int | None = FIRST_CHUNK_MAX_WORDS) -> tuple[list[str], str]:
    """The first chunk of a streamed reply to speak: a whole sentence if one ends first, else the first clause
    (up to a comma, semicolon, colon or dash) of at least ``FIRST_CLAUSE_MIN_WORDS`` words, else the first
    ``cut_words`` words once a further word has begun (None: no cut between words; the voice loop's second
    chunk, so that the rest of a long first sentence does not leave a gap while it is generated). Returns
    (chunks, tail) like :func:`split_sentences`; callers switch to :func:`split_sentences` after that."""
    sentences, tail = split_sentences(buffer, final)
    if sentences or final:
        return sentences, tail
    for match in _CLAUSE.finditer(buffer):
        clause = buffer[: match.end()].strip()
        if len(clause.split()) >= FIRST_CLAUSE_MIN_WORDS and not _LIST_NUMBER.fullmatch(clause):
            return [clause], buffer[match.end():].lstrip()
    words = list(re.finditer(r"\S*\w\S*", buffer))  # a lone dash is no word
    if cut_words is not None and len(words) > cut_words:  # the word after the cut has begun: the cut word is whole
        cut = words[cut_words - 1].end()
        return [buffer[:cut].strip()], buffer[cut:].lstrip()
    return [], buffer


def may_end_inside_sentence(spoken: int) -> bool:
    """Whether the next chunk of a reply, ``spoken`` chunks in, may end inside a sentence (:func:`split_reply`)."""
    return spoken < 2


def split_reply(buffer: str, spoken: int) -> tuple[list[str], str]:
    """The next chunks of a streamed reply to speak, ``spoken`` chunks in: the first may be cut between words,
    the second at a clause (:func:`split_first_clause`), the rest are whole sentences (:func:`split_sentences`)."""
    if may_end_inside_sentence(spoken):
        return split_first_clause(buffer, cut_words=FIRST_CHUNK_MAX_WORDS if spoken == 0 else None)
    return split_sentences(buffer)
