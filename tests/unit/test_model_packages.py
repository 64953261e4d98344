"""One package per model kind (``models/detectors``, ``models/stt``, ``models/llm``, ``models/tts``): the protocol
and the registry in the package's ``__init__``, each backend one module of the package holding its config, builder
and code."""

from __future__ import annotations

import inspect

import pytest

import models.detectors
import models.llm
import models.stt
import models.tts
from models.llm.embedded import EmbeddedLlm
from models.llm.openai_chat import OpenAiLlm
from models.llm.router import RoutedLlm
from models.stt.whisper import WhisperStt
from models.tts.espeak import EspeakTts
from models.tts.piper import PiperTts


@pytest.mark.parametrize(("package", "registry"), [
    (models.detectors, models.detectors.DETECTORS),
    (models.stt, models.stt.SPEECH_TO_TEXT),
    (models.llm, models.llm.LANGUAGE_MODELS),
    (models.tts, models.tts.TEXT_TO_SPEECH),
])
def test_every_backend_lives_in_its_kinds_package(package, registry):
    assert registry.backends
    for backend in registry.backends.values():
        module = backend.config.__module__
        assert module.startswith(package.__name__ + "."), (backend.name, module)
        assert backend.build.__module__ == module, (backend.name, backend.build.__module__)


def _parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(("protocol", "model"), [(models.stt.SpeechToText, WhisperStt),
                                                 (models.llm.LanguageModel, EmbeddedLlm),
                                                 (models.llm.LanguageModel, OpenAiLlm),
                                                 (models.llm.LanguageModel, RoutedLlm),
                                                 (models.tts.TextToSpeech, PiperTts),
                                                 (models.tts.TextToSpeech, EspeakTts)])
def test_the_backends_follow_their_kinds_protocol(protocol, model):
    methods = [name for name, value in vars(protocol).items() if inspect.isfunction(value) and name[0] != "_"]
    assert methods
    for name in methods:
        assert _parameters(getattr(model, name)) == _parameters(getattr(protocol, name)), name
