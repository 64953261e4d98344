"""The MQTT publisher: what the timeline commits (events, alerts, scene counts, snapshots) goes to a broker, with
Home Assistant discovery and an availability topic whose last will is ``offline``; on the same connection it takes
the commands of ``server.mqtt.commands``.

Why aiomqtt: it is asyncio-native (paho's network loop driven by the event loop's reader and writer callbacks, no
thread of its own), maintained, and built on paho-mqtt, the reference client; gmqtt and hbmqtt are unmaintained.

Nothing accepted is lost to a broker outage: events and snapshots wait in one bounded queue (``mqtt.queue_messages``;
past it new ones are dropped and counted) and leave it only once the broker acknowledged them (QoS 1), so a message
in flight when the connection broke is sent again after the reconnect (at least once). Counts and discovery configs
are state, not a stream: the latest value of each retained topic is kept and republished on every connection (a
broker restarted without persistence has forgotten its retained messages)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiomqtt
from aiohttp import web

from pipelines.timeline.store import TimelineEntry, TimelineStore
from server.config.mqtt import MqttSettings
from server.metrics import MQTT_CONNECTED, MQTT_DROPPED, MQTT_PUBLISHED, MQTT_QUEUED
from server.mqtt.commands import MqttCommands
from server.mqtt.messages import (
    PUBLISHED_KINDS,
    Outgoing,
    Topics,
    discovery_messages,
    encode,
    event_payload,
    source_of,
    switch_discovery,
)
from server.state import TIMELINE

log = logging.getLogger(__name__)

EVENT_LABELS_MAX = 4096  # recent events whose source and label a later snapshot is published under
SNAPSHOT_READS_MAX = 8  # snapshot files being read at once; more are dropped (and counted)
CLOSE_FLUSH_S = 2.0  # on shutdown, how long queued messages may take to reach a connected broker
SENSOR_ORIGINS = ("rtsp", "file")  # sources whose counts and snapshots are published (and discovered)
SOURCES_MAX = 256  # sources with counts kept and republished on every connection
AIOMQTT_NO_CONNACK = "Operation timed out"  # aiomqtt's MqttError when the CONNACK does not come in time

MQTT_PUBLISHER: web.AppKey[MqttPublisher] = web.AppKey("mqtt_publisher")


class PahoLog(logging.LoggerAdapter[logging.Logger]):
    """paho-mqtt's log, for one publisher. A socket error ("failed to receive on socket: ...") is kept as the reason
    the connection attempt failed: aiomqtt reports a connection lost before the broker's CONNACK only as "Operation
    timed out", and the TLS alert that says why (a client certificate required or refused) would be lost with it.
    It is said once in the publisher's warning, so paho's own line drops to DEBUG rather than an ERROR per retry."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("server.mqtt.paho"), {})
        self.socket_error: str | None = None

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level >= logging.ERROR and isinstance(msg, str) and "on socket" in msg:
            self.socket_error = msg % args if args else msg
            level = logging.DEBUG
        super().log(level, msg, *args, **kwargs)


class MqttPublisher:
    """One per app (``mqtt.enabled``). ``start(store)`` on the app's start-up listens to the timeline and connects;
    ``close()`` flushes what it can, says ``offline`` and disconnects."""

    def __init__(self, config: MqttSettings, *, snapshots_recorded: bool,
                 commands: MqttCommands | None = None) -> None:
        self.config = config
        self._commands = commands
        self.topics = Topics(config)
        self._snapshots = config.snapshots and snapshots_recorded
        self._queue: deque[Outgoing] = deque()
        self._state: OrderedDict[str, Outgoing] = OrderedDict()  # retained topic -> its latest message
        self._dirty: OrderedDict[str, None] = OrderedDict()  # retained topics not yet published on this connection
        self._counts: dict[str, dict[str, int]] = {}  # source -> label -> how many in view
        self._event_labels: OrderedDict[str, tuple[str, str]] = OrderedDict()  # event id -> (source, label)
        self._store: TimelineStore | None = None
        self._reads: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._tls: ssl.SSLContext | None = None
        self._paho = PahoLog()
        self.connected = False

    # ------------------------------------------------------------------ lifecycle

    def start(self, store: TimelineStore | None) -> None:
        """On the event loop: listen to ``store`` (None: storage is off, only availability is published)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if store is None:
            log.warning("mqtt: storage.enabled is false, so no events, counts or snapshots are published")
        else:
            self._store = store
            store.add_listener(self._from_writer(self._committed))
            store.add_snapshot_listener(self._from_writer(self._snapshot_committed))
        if self._commands is not None:
            self._set_state(self._commands.alerts_state())
            if self.config.discovery:
                prefix = self.topics.prefix
                self._set_state(switch_discovery(self.config, self.topics, "alerts", "Vigil alerts",
                                                 f"{prefix}/alerts/set", f"{prefix}/alerts/state"))
            for source, state in self._commands.kept_detect_states():  # as switched before the restart
                self._detect_switch(source, state)
            self._commands.watch_switches(self._detect_switch)
        self._task = asyncio.create_task(self._run(), name="mqtt:publisher")

    async def close(self) -> None:
        """Send what is queued (for a moment, if connected), publish ``offline`` and disconnect."""
        if self._task is None:
            return
        self._closing = True
        self._poke()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), CLOSE_FLUSH_S + self.config.publish_timeout_s)
        except TimeoutError:
            log.warning("mqtt: %d messages unsent at shutdown", len(self._queue))
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            for read in list(self._reads):
                read.cancel()
            MQTT_CONNECTED.set(0)

    # ------------------------------------------------------------------ from the timeline (writer thread -> loop)

    def _from_writer(self, handler: Callable[..., None]) -> Callable[..., None]:
        loop = self._loop
        assert loop is not None

        def hop(*args: Any) -> None:  # the store's writer thread: only hand over
            if not loop.is_closed():
                loop.call_soon_threadsafe(handler, *args)

        return hop

    def _committed(self, entries: list[TimelineEntry]) -> None:
        for entry in entries:
            if entry.kind == "scene":
                # Counts (and their sensors) only for server-side sources: cameras that stay. A WebRTC session's
                # id is new on every call, and would leave a retained topic and a sensor behind each time.
                if entry.origin in SENSOR_ORIGINS and (source_of(entry) in self._counts
                                                       or len(self._counts) < SOURCES_MAX):
                    self._scene(source_of(entry), entry.data.get("counts") or {})
            elif entry.kind in PUBLISHED_KINDS:
                payload = event_payload(entry, base_url=self.config.base_url, snapshots=self._snapshots)
                self._enqueue(Outgoing(self.topics.events, encode(payload)))
                label = payload.get("label")
                if entry.kind == "event" and label and entry.origin in SENSOR_ORIGINS:  # snapshots are retained too
                    self._event_labels[entry.id] = (source_of(entry), str(label))
                    while len(self._event_labels) > EVENT_LABELS_MAX:
                        self._event_labels.popitem(last=False)

    def _scene(self, source: str, counts: dict[str, int]) -> None:
        if source not in self._counts and self._commands is not None:  # a new source: its detection switch
            state = self._commands.detect_state(source)
            if state is not None:
                self._detect_switch(source, state)
        known = self._counts.setdefault(source, {})
        for label in sorted(set(known) | set(counts)):
            count = int(counts.get(label, 0))
            if known.get(label) == count:
                continue
            if label not in known and self.config.discovery:
                for message in discovery_messages(self.config, self.topics, source, label):
                    self._set_state(message)
            known[label] = count
            self._set_state(Outgoing(self.topics.count(source, label), str(count).encode(), retain=True))

    def _detect_switch(self, source: str, state: Outgoing) -> None:
        if self.config.discovery:
            prefix = self.topics.prefix
            self._set_state(switch_discovery(self.config, self.topics, f"{source}_detect", f"{source} detection",
                                             f"{prefix}/{source}/detect/set", state.topic))
        self._set_state(state)

    def _snapshot_committed(self, ids: list[str], relative: str) -> None:
        if not self._snapshots or self._store is None:
            return
        targets = list(dict.fromkeys(self._event_labels[i] for i in ids if i in self._event_labels))
        path = self._store.media_path(relative)
        if not targets or path is None:
            return
        if len(self._reads) >= SNAPSHOT_READS_MAX:
            MQTT_DROPPED.labels("snapshot").inc(len(targets))
            return
        read = asyncio.create_task(self._publish_snapshot(path, targets), name="mqtt:snapshot")
        self._reads.add(read)
        read.add_done_callback(self._reads.discard)

    async def _publish_snapshot(self, path: Path, targets: list[tuple[str, str]]) -> None:
        try:
            jpeg = await asyncio.to_thread(path.read_bytes)
        except OSError as error:  # deleted meanwhile (retention, the API): nothing to show
            log.debug("mqtt: snapshot %s unreadable: %s", path.name, error)
            return
        for source, label in targets:
            self._enqueue(Outgoing(self.topics.snapshot(source, label), jpeg, retain=True), kind="snapshot")

    # ------------------------------------------------------------------ the queue and the retained state

    def _enqueue(self, message: Outgoing, kind: str = "event") -> None:
        if len(self._queue) >= self.config.queue_messages:
            MQTT_DROPPED.labels(kind).inc()
            return
        self._queue.append(message)
        MQTT_QUEUED.set(len(self._queue))
        self._poke()

    def _set_state(self, message: Outgoing) -> None:
        self._state[message.topic] = message
        self._dirty[message.topic] = None
        self._dirty.move_to_end(message.topic)
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ the connection

    async def _run(self) -> None:
        config = self.config
        backoff = config.backoff_initial_s
        while not self._closing:
            try:
                await self._connected_session()
                backoff = config.backoff_initial_s
            except* aiomqtt.MqttError as errors:  # the broker is away or went away: keep everything, retry
                if self.connected or backoff == config.backoff_initial_s:
                    log.warning("mqtt: broker %s:%d unavailable (%s); %d messages queued, retrying",
                                config.host, config.port, self._reason(errors.exceptions[0]), len(self._queue))
            self.connected = False
            MQTT_CONNECTED.set(0)
            if self._closing:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, config.backoff_max_s)

    def _reason(self, error: BaseException) -> str:
        """Why an attempt failed, as the user can act on it. aiomqtt says only that the CONNACK never came when the
        connection was lost before it: the socket's error is given instead. A broker that checks the client's
        certificate after the TLS 1.3 handshake sends its alert and closes; when that close overtakes the alert
        (Vigil's CONNECT unread: a reset), an EOF or nothing at all is left, and the likely cause is named."""
        socket_error = self._paho.socket_error
        if self.connected or str(error) != AIOMQTT_NO_CONNACK:  # the socket's error, if any, says more
            if socket_error is None or socket_error in str(error):
                return str(error)
            return f"{error}: {socket_error}"
        if socket_error is not None and "EOF" not in socket_error:
            return socket_error
        silent = f"{socket_error or 'no CONNACK'}: the broker hung up or stayed silent"
        if not self.config.tls.enabled:  # a TLS listener reads a CONNECT as a broken handshake and hangs up
            return f"{silent}; if it speaks TLS, set mqtt.tls.enabled"
        if self.config.tls.cert_file is not None:
            return f"{silent} after the TLS handshake, it may refuse mqtt.tls.cert_file"
        return f"{silent} after the TLS handshake, it may require a client certificate: mqtt.tls.cert_file and key_file"

    async def _connected_session(self) -> None:
        config = self.config
        self._paho.socket_error = None
        will = aiomqtt.Will(self.topics.availability, b"offline", qos=config.qos, retain=True)
        password = config.password.get_secret_value() if config.password is not None else None
        if config.tls.enabled and self._tls is None:  # reads the PEM files: off the event loop, once
            try:
                self._tls = await asyncio.to_thread(config.tls.ssl_context)
            except OSError as error:  # ssl.SSLError is one: a file changed since the config was checked; retried
                raise aiomqtt.MqttError(f"TLS files unusable: {error}") from error
        async with aiomqtt.Client(config.host, config.port, username=config.username, password=password,
                                  identifier=config.client_id, will=will, keepalive=config.keepalive_s,
                                  timeout=config.publish_timeout_s, tls_context=self._tls,
                                  logger=self._paho) as client:  # type: ignore[arg-type]  # a Logger's calls
            self.connected = True
            MQTT_CONNECTED.set(1)
            log.info("mqtt: connected to %s:%d%s (%d messages queued)", config.host, config.port,
                     " over TLS" if self._tls is not None else "", len(self._queue))
            await client.publish(self.topics.availability, b"online", qos=config.qos, retain=True)
            for topic in self._commands.subscriptions() if self._commands is not None else ():
                await client.subscribe(topic, qos=config.qos)
            self._dirty = OrderedDict.fromkeys(self._state)  # the broker may have lost its retained messages
            async with asyncio.TaskGroup() as group:
                # Iterating the messages is what notices a lost connection while nothing is being published.
                watcher = group.create_task(self._watch(client))
                await self._send(client)
                watcher.cancel()
            await client.publish(self.topics.availability, b"offline", qos=config.qos, retain=True)

    async def _watch(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            if self._commands is None or not isinstance(message.payload, bytes | bytearray):
                continue
            try:
                for state in self._commands.handle(str(message.topic), bytes(message.payload)):
                    self._set_state(state)
            except Exception:  # a bad command must not end the connection
                log.exception("mqtt: command on %s failed", message.topic)

    async def _send(self, client: aiomqtt.Client) -> None:
        """Until closing: the retained state first (small, and a sensor's config before its value), then the queue in
        order. A message leaves the queue only once acknowledged: a broken connection raises and it stays."""
        assert self._wake is not None
        qos = self.config.qos
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            if self._dirty:
                topic = next(iter(self._dirty))
                message = self._state[topic]
                await client.publish(message.topic, message.payload, qos=qos, retain=message.retain)
                if self._state.get(topic) is message:  # not replaced meanwhile (else send the newer value too)
                    self._dirty.pop(topic, None)
                MQTT_PUBLISHED.labels("state").inc()
            elif self._queue:
                message = self._queue[0]
                await client.publish(message.topic, message.payload, qos=qos, retain=message.retain)
                self._queue.popleft()
                MQTT_QUEUED.set(len(self._queue))
                MQTT_PUBLISHED.labels("snapshot" if message.topic.endswith("/snapshot") else "event").inc()
            elif self._closing:
                return
            else:
                self._wake.clear()
                await self._wake.wait()
            if self._closing:
                deadline = deadline or loop.time() + CLOSE_FLUSH_S
                if loop.time() > deadline:
                    return


async def _start(app: web.Application) -> None:
    app[MQTT_PUBLISHER].start(app.get(TIMELINE))  # the stored timeline, set when storage is on


async def _close(app: web.Application) -> None:
    await app[MQTT_PUBLISHER].close()


def mount_mqtt(app: web.Application, publisher: MqttPublisher | None) -> None:
    """Start the publisher with the app and close it on cleanup: after the timeline's (which commits the last
    entries), so they are still sent."""
    if publisher is None:
        return
    app.on_startup.append(_start)
    app.on_cleanup.append(_close)

