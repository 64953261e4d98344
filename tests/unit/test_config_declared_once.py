"""Every knob is declared once: a pipeline declares its config (pydantic, with defaults and descriptions) and the
server's section is made of it, adding only what the server decides. Two declarations of one default drift apart
(they did: turn_detection, the face threshold)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from itertools import product

import pytest
from pydantic import BaseModel, ValidationError

from pipelines.video.faces import FaceRecognitionConfig
from pipelines.video.plates import PlateReadingConfig
from pipelines.voice.config import VoiceLoopConfig, VoiceLoopOptions
from server.config import VoiceSettings, load_settings
from server.config.faces import FacesSection, PlatesSection
from server.engines import voice_loop_config

# Sections that still repeat a pipeline's defaults instead of being made of its config. The list may only shrink
# (test_the_known_repeats_are_still_there): a new section repeats nothing.
KNOWN_REPEATS = {
    ("server.config.api.ChatCacheSettings", "pipelines.serving.chat.CacheConfig"),
    ("server.config.api.ContentFilterSettings", "pipelines.serving.content_filter.StreamingContentFilter"),
    ("server.config.sources.SourcesSettings", "pipelines.sources.container.ReaderSettings"),
    ("server.config.storage.AppearRule", "pipelines.timeline.recorder.AppearRule"),
    ("server.config.storage.StorageSettings", "pipelines.timeline.recorder.RecorderSettings"),
    ("server.config.video.VideoSettings", "pipelines.protocol.VideoSessionConfig"),
}


def _config_classes(package: str) -> list[type]:
    """The pydantic models and dataclasses defined in ``package``'s modules."""
    root = importlib.import_module(package)
    names = [package, *(m.name for m in pkgutil.walk_packages(root.__path__, f"{package}."))]
    found = []
    for name in names:
        module = importlib.import_module(name)
        found += [c for _, c in inspect.getmembers(module, inspect.isclass)
                  if c.__module__ == name and (issubclass(c, BaseModel) or dataclasses.is_dataclass(c))]
    return found


def _declared_defaults(cls: type) -> set[str]:
    """The fields whose default ``cls`` itself declares (not inherited). None is no value (a patch's unset key)."""
    own = inspect.get_annotations(cls)
    if issubclass(cls, BaseModel):
        fields = {name: info.get_default(call_default_factory=True) for name, info in cls.model_fields.items()
                  if not info.is_required()}
    else:
        fields = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                  for f in dataclasses.fields(cls)
                  if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    return {name for name, default in fields.items() if name in own and default is not None}


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def _repeats() -> dict[tuple[str, str], set[str]]:
    """(server section, pipeline config) -> the defaults both declare, for pairs that mirror each other: the same
    name, or two or more shared defaults (one shared name, such as ``enabled``, is a coincidence)."""
    sections, pipelines = _config_classes("server.config"), _config_classes("pipelines")
    repeats = {}
    for section, pipeline in product(sections, pipelines):
        shared = _declared_defaults(section) & _declared_defaults(pipeline)
        if shared and (len(shared) >= 2 or section.__name__ == pipeline.__name__):
            repeats[_qualified(section), _qualified(pipeline)] = shared
    return repeats


def test_no_default_is_declared_in_a_pipeline_and_again_in_a_server_section():
    new = {pair: sorted(names) for pair, names in _repeats().items() if pair not in KNOWN_REPEATS}
    assert not new, f"declared twice (make the section of the pipeline's config instead): {new}"


def test_the_known_repeats_are_still_there():
    assert KNOWN_REPEATS <= set(_repeats()), "a repeat is gone: take it off KNOWN_REPEATS"


def test_the_check_finds_a_repeated_default():
    class RepeatedForTest(BaseModel):
        min_score: float = 0.6
        settle_score: float = 0.95

    assert _declared_defaults(RepeatedForTest) & _declared_defaults(PlateReadingConfig) == {"min_score",
                                                                                             "settle_score"}
    assert not _declared_defaults(PlatesSection) & _declared_defaults(PlateReadingConfig)  # inherited: shared


@pytest.mark.parametrize(("section", "pipeline_config", "server_only"), [
    (VoiceSettings, VoiceLoopOptions, {"enabled", "echo_gating", "system_prompt"}),
    (FacesSection, FaceRecognitionConfig, {"model"}),
    (PlatesSection, PlateReadingConfig, {"model"}),
])
def test_a_section_is_its_pipelines_config_and_adds_only_the_servers_fields(section, pipeline_config, server_only):
    assert issubclass(section, pipeline_config)
    assert set(section.model_fields) - set(pipeline_config.model_fields) == server_only


def _changed(value: object) -> object:
    """A valid value unlike the default, for every field type the voice section uses."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 if value < 0.4 else value / 2 if isinstance(value, float) else value + 1
    if isinstance(value, str):
        return value + " (changed)"
    raise AssertionError(f"add a case for {value!r}")


def test_every_voice_value_set_in_the_config_arrives():
    defaults = VoiceSettings()
    overrides = {name: _changed(getattr(defaults, name)) for name in VoiceLoopOptions.model_fields
                 if name != "turn_detection"}
    overrides["turn_detection"] = "silence"  # a Literal: the other choice than the default (smart-turn)
    assert defaults.turn_detection != "silence"
    overrides["system_prompt"] = "Be brief."
    settings = load_settings(None, {"voice": {**overrides, "echo_gating": "on"}})
    loop = voice_loop_config(settings, "webrtc")
    for name, value in overrides.items():
        assert getattr(loop, name) == value, name
    assert loop.echo_gating is True


@pytest.mark.parametrize(("echo_gating", "origin", "gated"), [
    ("auto", "rtsp", True), ("auto", "file", True), ("auto", "webrtc", False), ("auto", "grpc", False),
    ("on", "webrtc", True), ("off", "rtsp", False),
])
def test_auto_echo_gating_is_the_servers_decision_per_origin(echo_gating: str, origin: str, gated: bool):
    settings = load_settings(None, {"voice": {"echo_gating": echo_gating}})
    assert voice_loop_config(settings, origin).echo_gating is gated


def test_the_voice_prompt_and_echo_gating_have_one_source():
    with pytest.raises(ValidationError) as error:
        VoiceLoopConfig()  # type: ignore[call-arg]  # no second default to drift from the server's
    assert {e["loc"][0] for e in error.value.errors()} == {"echo_gating", "system_prompt"}


def test_the_loop_config_checks_what_the_section_checks():
    with pytest.raises(ValidationError, match="turn_max_silence_ms must be longer"):
        VoiceLoopConfig(echo_gating=False, system_prompt="x", turn_check_silence_ms=500, turn_max_silence_ms=400)
