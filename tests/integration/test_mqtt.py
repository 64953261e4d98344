"""MQTT out: a real mosquitto broker and a real MQTT client (aiomqtt) watching what Vigil publishes: events, counts,
snapshots, availability (retained, with a last will) and Home Assistant discovery; a broker outage loses nothing
accepted, and past the queue's bound drops are counted."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import pytest
from PIL import Image
from prometheus_client import REGISTRY

from pipelines.timeline.store import TimelineEntry
from server.config import ConfigError, load_settings
from server.engines import Analyzers
from server.mqtt.publisher import MQTT_PUBLISHER
from server.state import TIMELINE
from tests.integration.test_sources import Watcher
from tests.support.media import keyframed_sliding_person, make_clip
from tests.support.mosquitto import MosquittoServer
from tests.support.ports import free_port
from tests.support.tls_certs import make_authority
from tests.support.vigil_process import VigilProcess
from tests.support.zone_entry import RIGHT_HALF, ZoneEntryAnalyzerForTest


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mqtt-media")
    keyframed_sliding_person(root / "slide.mp4")
    return root


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    with MosquittoServer(tmp_path / "broker", persistent=True) as server:
        yield server


@dataclass
class Received:
    topic: str
    payload: bytes
    retain: bool

    def json(self) -> Any:
        return json.loads(self.payload)


@dataclass
class MqttWatcher:
    """A real MQTT client subscribed to ``topics``, keeping every message it receives (in ``seen``)."""

    port: int
    topics: tuple[str, ...] = ("#",)
    identifier: str | None = None  # with one, a durable session (clean_session off): the broker keeps its messages
    tls_context: ssl.SSLContext | None = None  # for a TLS listener
    seen: list[Received] = field(default_factory=list)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @contextlib.asynccontextmanager
    async def listening(self) -> AsyncIterator[MqttWatcher]:
        durable = self.identifier is not None
        async with aiomqtt.Client("127.0.0.1", self.port, identifier=self.identifier,
                                  clean_session=False if durable else None, tls_context=self.tls_context) as client:
            for topic in self.topics:
                await client.subscribe(topic, qos=1)
            task = asyncio.create_task(self._read(client))
            try:
                yield self
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                    await task

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            payload = message.payload if isinstance(message.payload, bytes) else str(message.payload).encode()
            self.seen.append(Received(str(message.topic), payload, bool(message.retain)))
            self._arrived.set()

    async def wait(self, done: Callable[[list[Received]], bool], timeout: float = 30.0) -> list[Received]:
        async with asyncio.timeout(timeout):
            while not done(self.seen):
                self._arrived.clear()
                await self._arrived.wait()
        return self.seen

    def on(self, topic: str) -> list[Received]:
        return [m for m in self.seen if m.topic == topic]


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def _mqtt(port: int, **extra: Any) -> dict[str, Any]:
    return {"enabled": True, "port": port, "backoff_initial_s": 0.1, "backoff_max_s": 0.5, "publish_timeout_s": 2.0,
            **extra}


def _event_ids(watcher: MqttWatcher) -> set[str]:
    return {m.json()["id"] for m in watcher.on("vigil/events")}


async def test_a_person_walking_into_a_zone_is_published_with_counts_snapshot_and_discovery(
        vigil, broker: MosquittoServer, media: Path, tmp_path: Path):
    server = await vigil(sources={"media_root": str(media)}, video={"target_fps": 5},
                         models={"detector": {"backend": "yolo"}}, mqtt=_mqtt(broker.port, base_url="http://vigil.lan"),
                         storage={"data_dir": str(tmp_path / "events"), "scene_interval_s": 1.0})
    watcher = MqttWatcher(broker.port, topics=("vigil/#", "homeassistant/#"))
    async with watcher.listening(), aiohttp.ClientSession() as http:
        await watcher.wait(lambda seen: any(m.topic == "vigil/available" for m in seen))
        assert watcher.on("vigil/available")[-1].payload == b"online"
        late = MqttWatcher(broker.port, topics=("vigil/available",))
        async with late.listening():  # retained: a subscriber that comes later learns it at once
            await late.wait(lambda seen: bool(seen))
        assert (late.seen[0].payload, late.seen[0].retain) == (b"online", True)

        body = {"path": "slide.mp4", "name": "hall", "realtime": False,
                "options": {"video": {"zones": [RIGHT_HALF]}}}
        async with http.post(f"{server.url}/api/sources", json=body) as response:
            assert response.status == 201, await response.text()
            source = await response.json()
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            await Watcher(ws).state("ended", timeout=90)
        await watcher.wait(lambda seen: any(m.topic == "vigil/hall/person/snapshot" for m in seen)
                           and any(m.topic == "vigil/hall/person" and m.payload == b"1" for m in seen))

    events = [m.json() for m in watcher.on("vigil/events")]
    enters = [e for e in events if e["type"] == "zone.enter"]
    assert len(enters) == 1, events
    enter = enters[0]
    assert enter["source"] == source["id"] and enter["source_name"] == "hall" and enter["label"] == "person"
    assert enter["zone"] == "door" and isinstance(enter["track_id"], int) and enter["time"] == pytest.approx(
        time.time(), abs=120)
    assert enter["snapshot_url"] == f"http://vigil.lan/api/events/{enter['id']}/snapshot.jpg"
    assert enter["clip_url"] == f"http://vigil.lan/api/events/{enter['id']}/clip.mp4"
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/events/{enter['id']}") as response:
        assert (await response.json())["data"]["zone"] == "door"  # the same event as the REST API's

    count = watcher.on("vigil/hall/person")
    assert count[-1].payload == b"1" and all(m.payload.isdigit() for m in count)
    snapshot = watcher.on("vigil/hall/person/snapshot")[-1]
    assert Image.open(io.BytesIO(snapshot.payload)).format == "JPEG"

    sensor = watcher.on("homeassistant/sensor/vigil_hall_person/config")[-1]
    config = sensor.json()
    assert config["state_topic"] == "vigil/hall/person" and config["availability_topic"] == "vigil/available"
    assert config["unique_id"] == "vigil_hall_person_count" and config["device"]["identifiers"] == ["vigil"]
    camera = watcher.on("homeassistant/camera/vigil_hall_person/config")[-1].json()
    assert camera["topic"] == "vigil/hall/person/snapshot"
    # Discovery before the value it describes, so Home Assistant's sensor exists when its first state arrives.
    topics = [m.topic for m in watcher.seen]
    assert topics.index("homeassistant/sensor/vigil_hall_person/config") < topics.index("vigil/hall/person")

    # Shut down: availability turns offline (retained) for whoever subscribes next.
    await server.stop()
    late = MqttWatcher(broker.port, topics=("vigil/available",))
    async with late.listening():
        seen = await late.wait(lambda seen: bool(seen))
    assert seen[0].payload == b"offline" and seen[0].retain


def _entry(source: str, n: int) -> TimelineEntry:
    return TimelineEntry(kind="event", name="zone.enter", source=source, origin="file", wall_ts=time.time(),
                         pts=float(n), data={"zone": "door", "label": "person", "track_id": n, "conf": 0.9,
                                             "identity": {"name": "Alice", "score": 0.95}})


def _scene(source: str, people: int) -> TimelineEntry:
    return TimelineEntry(kind="scene", name="scene", source=source, origin="file", wall_ts=time.time(),
                         data={"counts": {"person": people} if people else {}, "tracks": []})


async def test_a_broker_restart_mid_stream_loses_nothing(vigil, broker: MosquittoServer, tmp_path: Path):
    server = await vigil(mqtt=_mqtt(broker.port), storage={"data_dir": str(tmp_path / "events")})
    store, publisher = server.app[TIMELINE], server.app[MQTT_PUBLISHER]
    watcher = MqttWatcher(broker.port, topics=("vigil/events",), identifier="test-watcher")
    before = [_entry("cam", n) for n in range(5)]
    async with watcher.listening():
        for entry in before:
            store.put(entry)
        await watcher.wait(lambda seen: len(_event_ids(watcher)) == 5)
        first = watcher.on("vigil/events")[0].json()
        assert first["identity"] == {"name": "Alice", "score": 0.95} and first["score"] == 0.9
        assert first["clip_url"] is None  # this entry has no clip coming

        broker.stop()  # mid-stream: the next events are accepted while it is away
        during = [_entry("cam", n) for n in range(5, 10)]
        for entry in during:
            store.put(entry)
        store.put(_scene("cam", 2))
        await until(lambda: len(publisher._queue) >= 5)  # all five wait in Vigil's queue
        assert not publisher.connected
    broker.start()  # the same port; its persisted session keeps the watcher's subscription
    async with watcher.listening():
        await watcher.wait(lambda seen: len(_event_ids(watcher)) == 10)
    assert _event_ids(watcher) == {e.id for e in before + during}
    ordered = [m.json()["track_id"] for m in watcher.on("vigil/events")]
    assert sorted(dict.fromkeys(ordered), key=ordered.index) == list(range(10))  # in order (re-sends aside)

    state = MqttWatcher(broker.port, topics=("vigil/available", "vigil/cam/person"))
    async with state.listening():
        await state.wait(lambda seen: len(seen) >= 2)
    assert {(m.topic, m.payload, m.retain) for m in state.seen} == {
        ("vigil/available", b"online", True), ("vigil/cam/person", b"2", True)}


async def test_past_the_queue_bound_messages_are_dropped_and_counted(vigil, tmp_path: Path):
    port = free_port()  # no broker there yet
    server = await vigil(mqtt=_mqtt(port, queue_messages=3), storage={"data_dir": str(tmp_path / "events")})
    store = server.app[TIMELINE]
    dropped_before = REGISTRY.get_sample_value("vigil_mqtt_dropped_total", {"kind": "event"}) or 0.0
    entries = [_entry("cam", n) for n in range(5)]
    for entry in entries:
        store.put(entry)
    await until(lambda: (REGISTRY.get_sample_value("vigil_mqtt_dropped_total", {"kind": "event"}) or 0.0)
                >= dropped_before + 2)
    # The watcher's durable session is made on another port first, so it exists before Vigil can connect.
    late_broker = MosquittoServer(tmp_path / "late-broker", persistent=True).start()
    watcher = MqttWatcher(late_broker.port, topics=("vigil/events",), identifier="late")
    async with watcher.listening():
        pass
    late_broker.stop()
    late_broker.port = watcher.port = port
    with late_broker:  # started again, on the port Vigil is trying
        async with watcher.listening():
            await watcher.wait(lambda seen: len(_event_ids(watcher)) == 3)
    assert _event_ids(watcher) == {e.id for e in entries[:3]}  # the first three, accepted; the rest dropped
    assert REGISTRY.get_sample_value("vigil_mqtt_dropped_total", {"kind": "event"}) == dropped_before + 2


async def test_the_broker_password_is_used_and_never_shown(vigil, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    secret = "s3cret-Broker-Pw"
    caplog.set_level(logging.DEBUG)
    with MosquittoServer(tmp_path / "broker", password=("vigil", secret)) as broker:
        wrong = await vigil(mqtt=_mqtt(broker.port, username="vigil", password="not-it"),
                            storage={"data_dir": str(tmp_path / "wrong")})
        await asyncio.sleep(1.0)
        assert not wrong.app[MQTT_PUBLISHER].connected  # refused
        await wrong.stop()
        server = await vigil(mqtt=_mqtt(broker.port, username="vigil", password=secret),
                             storage={"data_dir": str(tmp_path / "right")})
        await until(lambda: server.app[MQTT_PUBLISHER].connected)
        assert secret not in json.dumps(server.settings.masked())
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as response:
            assert secret not in await response.text()
    assert secret not in caplog.text and "not-it" not in caplog.text


async def test_tls_to_the_broker_is_verified_both_ways_and_carries_the_events(vigil, tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture):
    """A broker that listens only on TLS and asks for a client certificate (mosquitto `require_certificate`): Vigil
    connects with the CA that signed it and its own certificate, and a TLS subscriber gets its events; a broker
    signed by another CA, no client certificate, or plain TCP: never connected, and said why in the log."""
    caplog.set_level(logging.WARNING)
    authority, other = make_authority(tmp_path / "pki"), make_authority(tmp_path / "other-pki", "Another CA")
    ours = {"enabled": True, "ca_file": str(authority.ca), "cert_file": str(authority.client.cert),
            "key_file": str(authority.client.key)}
    with MosquittoServer(tmp_path / "broker", tls=authority, require_certificate=True) as broker:
        # TLS 1.3: the broker checks the client's certificate after the handshake and sends its alert; when its close
        # overtakes the alert (a reset: Vigil's CONNECT was unread), the log names the likely cause instead.
        refused = {  # what Vigil is configured with -> the reasons its warning may give
            "CERTIFICATE_VERIFY_FAILED": ({**ours, "ca_file": str(other.ca)},),  # the broker's CA is not trusted
            "CERTIFICATE_REQUIRED": ({"enabled": True, "ca_file": str(authority.ca)},  # no client certificate
                                     "it may require a client certificate: mqtt.tls.cert_file and key_file"),
            "UNKNOWN_CA": ({**ours, "cert_file": str(other.client.cert), "key_file": str(other.client.key)},
                           "it may refuse mqtt.tls.cert_file"),
            "Connection reset": ({"enabled": False}, "if it speaks TLS, set mqtt.tls.enabled"),  # plain TCP
        }
        for number, (case, (tls, *or_else)) in enumerate(refused.items()):
            caplog.clear()
            server = await vigil(mqtt=_mqtt(broker.port, tls=tls), storage={"data_dir": str(tmp_path / f"r{number}")})
            await until(lambda: "unavailable" in caplog.text, timeout=15.0)
            assert not server.app[MQTT_PUBLISHER].connected, case
            warning = next(r.getMessage() for r in caplog.records if "unavailable" in r.getMessage())
            assert any(reason in warning for reason in (case, *or_else)), warning  # the publisher's own line says why
            assert "Operation timed out" not in warning
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text  # said once, as that
            await server.stop()

        server = await vigil(mqtt=_mqtt(broker.port, tls=ours), storage={"data_dir": str(tmp_path / "events")})
        await until(lambda: server.app[MQTT_PUBLISHER].connected)
        context = ssl.create_default_context(cafile=str(authority.ca))
        context.load_cert_chain(str(authority.client.cert), str(authority.client.key))
        watcher = MqttWatcher(broker.port, topics=("vigil/events", "vigil/available"), tls_context=context)
        async with watcher.listening():
            server.app[TIMELINE].put(_entry("cam", 1))
            await watcher.wait(lambda seen: len(_event_ids(watcher)) == 1)
        assert watcher.on("vigil/events")[0].json()["track_id"] == 1
        assert (b"online", True) in {(m.payload, m.retain) for m in watcher.on("vigil/available")}


async def test_a_broker_that_hangs_up_before_answering_is_named_as_the_likely_cause(
        vigil, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """How mosquitto's refusal of a client certificate looks when its close overtakes its TLS 1.3 alert: the handshake
    done, Vigil's CONNECT read, then a hang-up without a word (and, without TLS, how a TLS listener can look). A
    listener of asyncio's, not mosquitto, makes that race certain. Vigil's warning names the likely cause, not
    aiomqtt's bare "Operation timed out"."""
    caplog.set_level(logging.WARNING)
    authority = make_authority(tmp_path / "pki")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(authority.server.cert), str(authority.server.key))
    hang_ups = 0

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal hang_ups
        await reader.read(1)  # the CONNECT has come: read, so the close is a FIN and not a reset
        writer.transport.abort()  # no close_notify: an EOF "in violation of protocol" at Vigil's end
        hang_ups += 1

    trusted = {"enabled": True, "ca_file": str(authority.ca)}
    cases = ((context, trusted, "after the TLS handshake, it may require a client certificate: mqtt.tls.cert_file"),
             (context, {**trusted, "cert_file": str(authority.client.cert), "key_file": str(authority.client.key)},
              "after the TLS handshake, it may refuse mqtt.tls.cert_file"),
             (None, {"enabled": False}, "stayed silent; if it speaks TLS, set mqtt.tls.enabled"))
    for number, (listening_tls, tls, cause) in enumerate(cases):
        caplog.clear()
        async with await asyncio.start_server(hang_up, "127.0.0.1", 0, ssl=listening_tls) as listener:
            port = listener.sockets[0].getsockname()[1]
            server = await vigil(mqtt=_mqtt(port, tls=tls), storage={"data_dir": str(tmp_path / f"r{number}")})
            await until(lambda: "unavailable" in caplog.text, timeout=15.0)
            warning = next(r.getMessage() for r in caplog.records if "unavailable" in r.getMessage())
            assert cause in warning, warning
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
            await server.stop()
        assert hang_ups > number


def test_tls_files_that_cannot_work_are_refused_when_the_config_is_read(tmp_path: Path):
    authority = make_authority(tmp_path / "pki")
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate")
    client, server_key = str(authority.client.cert), str(authority.server.key)
    cases = (({"ca_file": str(tmp_path / "missing.crt")}, "mqtt.tls.ca_file: no such file"),
             ({"ca_file": str(not_pem)}, "the certificate files do not load"),
             ({"cert_file": client}, "cert_file and key_file go together"),
             ({"cert_file": client, "key_file": server_key}, "the certificate files do not load"))  # not its key
    for tls, says in cases:
        with pytest.raises(ConfigError) as refused:
            load_settings(None, {"mqtt": _mqtt(1883, tls={"enabled": True, **tls})})
        assert says in str(refused.value), (tls, str(refused.value))
    accepted = load_settings(None, {"mqtt": _mqtt(8883, tls={"enabled": True, "ca_file": str(authority.ca)})})
    assert accepted.mqtt.tls.enabled and accepted.mqtt.tls.ssl_context().check_hostname
    lenient = accepted.mqtt.tls.model_copy(update={"verify_hostname": False}).ssl_context()
    assert lenient.check_hostname is False and lenient.verify_mode == ssl.CERT_REQUIRED


class ZoneEntryAtOnceAnalyzerForTest(ZoneEntryAnalyzerForTest):
    def due(self, sampled: Any) -> bool:
        return True


async def _publish(port: int, topic: str, payload: bytes, *, retain: bool = False) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as client:
        await client.publish(topic, payload, qos=1, retain=retain)


async def _source(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(f"{url}/api/sources", json=body) as response:
        assert response.status == 201, await response.text()
        return await response.json()


async def _get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def test_detection_is_switched_off_and_on_by_command(vigil, broker: MosquittoServer, tmp_path: Path):
    server = await vigil(mqtt=_mqtt(broker.port), storage={"data_dir": str(tmp_path / "events")})
    watcher = MqttWatcher(broker.port, topics=("vigil/+/detect/state",))
    async with watcher.listening(), aiohttp.ClientSession() as http:
        await until(lambda: server.app[MQTT_PUBLISHER].connected)
        source = await _source(http, server.url, {"path": "clip.mp4", "name": "yard", "loop": True})
        info = f"{server.url}/api/sources/{source['id']}"
        await until(lambda: server.sources.get(source["id"]).pipeline.counts.video.frames_sampled > 0)

        await _publish(broker.port, "vigil/yard/detect/set", b"OFF")
        await watcher.wait(lambda seen: any(m.payload == b"OFF" for m in seen))
        assert watcher.seen[-1].topic == "vigil/yard/detect/state"
        assert (await _get(http, info))["config"]["video"]["detect"] is False  # as a config patch sets it
        counts = server.sources.get(source["id"]).pipeline.counts.video
        sampled = counts.frames_sampled
        frames_in = counts.frames_in
        await until(lambda: counts.frames_in > frames_in + 10)  # frames keep coming ...
        assert counts.frames_sampled == sampled  # ... and none is analysed

        await _publish(broker.port, f"vigil/{source['id']}/detect/set", b"on")  # by id too
        await watcher.wait(lambda seen: seen[-1].payload == b"ON")
        await until(lambda: counts.frames_sampled > sampled)
        await _publish(broker.port, "vigil/nowhere/detect/set", b"OFF")  # no such source: ignored, still connected
        await _publish(broker.port, "vigil/yard/detect/set", b"maybe")
        await asyncio.sleep(0.3)
        assert server.app[MQTT_PUBLISHER].connected and (await _get(http, info))["config"]["video"]["detect"]

    state = MqttWatcher(broker.port, topics=("vigil/yard/detect/state",))
    async with state.listening():  # retained
        await state.wait(lambda seen: bool(seen))
    assert (state.seen[0].payload, state.seen[0].retain) == (b"ON", True)


async def test_alerts_are_switched_off_and_on_by_command(vigil, broker: MosquittoServer, tmp_path: Path):
    door = {"name": "door", "polygon": [[0, 0], [1, 0], [1, 1], [0, 1]], "announce": "Someone at the {zone}"}
    server = await vigil(Analyzers(video=ZoneEntryAtOnceAnalyzerForTest), mqtt=_mqtt(broker.port),
                         storage={"data_dir": str(tmp_path / "events")})
    watcher = MqttWatcher(broker.port, topics=("vigil/alerts/state", "vigil/events"))
    async with watcher.listening(), aiohttp.ClientSession() as http:
        await watcher.wait(lambda seen: any(m.topic == "vigil/alerts/state" for m in seen))
        assert watcher.on("vigil/alerts/state")[-1].payload == b"ON"
        await _publish(broker.port, "vigil/alerts/set", b"OFF")
        await watcher.wait(lambda seen: seen[-1].topic == "vigil/alerts/state" and seen[-1].payload == b"OFF")

        body = {"path": "clip.mp4", "realtime": False, "options": {"video": {"zones": [door]}}}
        quiet = await _source(http, server.url, {**body, "name": "quiet"})
        await watcher.wait(lambda seen: any(m.topic == "vigil/events" and m.json()["source"] == quiet["id"]
                                            for m in seen))
        await _publish(broker.port, "vigil/alerts/set", b"ON")
        await watcher.wait(lambda seen: seen[-1].topic == "vigil/alerts/state" and seen[-1].payload == b"ON")
        loud = await _source(http, server.url, {**body, "name": "loud"})
        await watcher.wait(lambda seen: any(m.topic == "vigil/events" and m.json()["type"] == "alert"
                                            for m in seen))
        alerts = (await _get(http, f"{server.url}/api/events?kind=alert"))["events"]
    assert [a["source"] for a in alerts] == [loud["id"]] and alerts[0]["text"] == "Someone at the door"
    published = [m.json() for m in watcher.on("vigil/events") if m.json()["type"] == "alert"]
    assert [(a["source"], a["text"], a["event"], a["zone"]) for a in published] == [
        (loud["id"], "Someone at the door", "zone.enter", "door")]


async def test_say_to_a_session_without_a_voice_is_refused_quietly(vigil, broker: MosquittoServer, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture):
    server = await vigil(mqtt=_mqtt(broker.port), storage={"data_dir": str(tmp_path / "events")})
    async with aiohttp.ClientSession() as http:
        await until(lambda: server.app[MQTT_PUBLISHER].connected)
        source = await _source(http, server.url, {"path": "clip.mp4", "name": "yard", "loop": True})
        await _publish(broker.port, f"vigil/{source['id']}/say", b"Hello there")
        await _publish(broker.port, "vigil/nobody/say", b"Hello there")
        await until(lambda: caplog.text.count("/say:") >= 2)
    assert "the session has no voice to say it with" in caplog.text and "no such session" in caplog.text
    assert server.app[MQTT_PUBLISHER].connected


async def test_say_is_spoken_on_a_voice_session_and_stored_as_an_alert(vigil, model_pool, broker: MosquittoServer,
                                                                       media: Path, tmp_path: Path):
    from aiortc.contrib.media import MediaPlayer

    from server.config import load_settings
    from server.engines import Engines
    from tests.integration.test_alerts import VOICE, Call, _alert, _heard

    settings = load_settings(None, {"voice": VOICE, "models": {"detector": {"backend": "none"}}})
    analyzers = Engines(settings, models=model_pool).analyzers
    server = await vigil(analyzers, voice=VOICE, mqtt=_mqtt(broker.port),
                         storage={"data_dir": str(tmp_path / "events"), "clips": False})
    watcher = MqttWatcher(broker.port, topics=("vigil/events",))
    async with watcher.listening(), Call(server.url, MediaPlayer(str(media / "slide.mp4"), loop=True).video,
                                         {}) as call:
        await until(lambda: server.app[MQTT_PUBLISHER].connected and len(server.sessions) == 1)
        (session_id,) = server.sessions.sessions
        await _publish(broker.port, f"vigil/{session_id}/say", b"The parcel has arrived at the door.")
        alert_at, _ = await call.wait_for(_alert)
        await call.quiet()
        assert call.recorder is not None
        assert "parcel" in _heard(call.recorder.audio(since=alert_at - 0.5)).lower()
        await watcher.wait(lambda seen: any(m.json()["type"] == "alert" for m in seen))
    said = [m.json() for m in watcher.on("vigil/events") if m.json()["type"] == "alert"]
    assert [(a["source"], a["event"], a["text"], a["spoken"]) for a in said] == [
        (session_id, "say", "The parcel has arrived at the door.", True)]


async def _retained(port: int, topics: tuple[str, ...]) -> dict[str, bytes]:
    """What a subscriber that comes now is told at once on ``topics``: the retained messages."""
    late = MqttWatcher(port, topics=topics)
    async with late.listening():
        await late.wait(lambda seen: {m.topic for m in seen} >= set(topics))
    assert all(m.retain for m in late.seen)
    return {m.topic: m.payload for m in late.seen}


async def test_switches_are_kept_across_a_restart(broker: MosquittoServer, tmp_path: Path):
    """Real `vigil serve` processes on one data dir: detection and alerts switched off over MQTT stay off after a
    restart, and the restarted server says so on the retained state topics (wiped from the broker meanwhile)."""
    (tmp_path / "media").mkdir()
    make_clip(tmp_path / "media" / "clip.mp4", seconds=2.0)
    config = {"mqtt": _mqtt(broker.port), "storage": {"data_dir": str(tmp_path / "data")},
              "sources": {"media_root": str(tmp_path / "media")}, "models": {"detector": {"backend": "none"}},
              "voice": {"enabled": False}}
    states = ("vigil/yard/detect/state", "vigil/alerts/state")
    yard = {"path": "clip.mp4", "name": "yard", "loop": True}

    first = await asyncio.to_thread(VigilProcess(tmp_path, config).start)
    try:
        source = await asyncio.to_thread(first.api, "POST", "/api/sources", yard)
        watcher = MqttWatcher(broker.port, topics=states)
        async with watcher.listening():
            await watcher.wait(lambda seen: any(m.topic == "vigil/alerts/state" for m in seen))
            await _publish(broker.port, "vigil/yard/detect/set", b"OFF")
            await _publish(broker.port, "vigil/alerts/set", b"OFF")
            await watcher.wait(lambda seen: {(m.topic, m.payload) for m in seen} >= {(t, b"OFF") for t in states})
        detect = (await asyncio.to_thread(first.api, "GET", f"/api/sources/{source['id']}"))["config"]["video"]
        assert detect["detect"] is False
    finally:
        await asyncio.to_thread(first.stop)
    for topic in states:  # an empty retained message deletes it: only the restarted server can say OFF again
        await _publish(broker.port, topic, b"", retain=True)

    second = await asyncio.to_thread(VigilProcess(tmp_path, config).start)
    try:
        assert await _retained(broker.port, states) == dict.fromkeys(states, b"OFF")  # before the source is back
        again = await asyncio.to_thread(second.api, "POST", "/api/sources", yard)  # a new id, the same name
        assert again["id"] != source["id"]
        info = await asyncio.to_thread(second.api, "GET", f"/api/sources/{again['id']}")
        assert info["config"]["video"]["detect"] is False
        other = await asyncio.to_thread(second.api, "POST", "/api/sources", {**yard, "name": "lawn"})
        assert (await asyncio.to_thread(second.api, "GET", f"/api/sources/{other['id']}"))["config"]["video"][
            "detect"] is True  # only the switched source

        # The REST config patch is the same switch: kept, and the retained state follows it.
        watcher = MqttWatcher(broker.port, topics=states)
        async with watcher.listening():
            await asyncio.to_thread(second.api, "POST", f"/api/sources/{again['id']}/config",
                                    {"video": {"detect": True}})
            await _publish(broker.port, "vigil/alerts/set", b"ON")
            await watcher.wait(lambda seen: {(m.topic, m.payload) for m in seen} >= {(t, b"ON") for t in states})
        # The state is published at once and the file written just after, on the switches' writer thread.
        kept = tmp_path / "data" / "switches.json"
        await until(lambda: json.loads(kept.read_text()) == {"detect": {"yard": True}, "alerts": True})
        assert await _retained(broker.port, states) == dict.fromkeys(states, b"ON")
    finally:
        await asyncio.to_thread(second.stop)
