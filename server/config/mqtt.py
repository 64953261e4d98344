"""``mqtt``: events, per-source counts, snapshots and availability published to an MQTT broker, with Home
Assistant discovery (``docs/mqtt.md``)."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from server.config.base import Section

_TOPIC_PART = re.compile(r"^[^#+\x00]+$")


class MqttTlsSettings(Section):
    enabled: bool = Field(False, description="Connect over TLS (brokers usually listen on 8883 for it; set `port`).")
    ca_file: Path | None = Field(None, description="PEM file of the CA(s) that signed the broker's certificate; "
                                 "unset: the system's trust store.")
    cert_file: Path | None = Field(None, description="PEM client certificate, for a broker that asks for one "
                                   "(`require_certificate`); with `key_file`.")
    key_file: Path | None = Field(None, description="PEM private key of `cert_file` (unencrypted; keep it readable "
                                  "only by Vigil).")
    verify_hostname: bool = Field(True, description="Check that the broker's certificate names `host`; false only "
                                  "for a broker reached by an address its certificate does not name (the chain is "
                                  "still verified).")

    @model_validator(mode="after")
    def _files(self) -> MqttTlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("mqtt.tls: cert_file and key_file go together (a client certificate needs its key)")
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, key)
            if path is not None and not path.is_file():
                raise ValueError(f"mqtt.tls.{key}: no such file: {path}")
        if self.enabled:  # a PEM file that does not parse is refused now, not at the first connection
            try:
                self.ssl_context()
            except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
                raise ValueError(f"mqtt.tls: the certificate files do not load: {error}") from None
        return self

    def ssl_context(self) -> ssl.SSLContext:
        """The broker's certificate verified against ``ca_file`` (or the system's trust store) and, unless told not
        to, against the host name; a client certificate presented when configured. TLS 1.2 at least (Python's
        default). Reads the PEM files: blocking."""
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file is not None else None)
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        context.check_hostname = self.verify_hostname
        return context


class MqttSettings(Section):
    enabled: bool = Field(False, description="Publish to an MQTT broker (the timeline's events, alerts, counts and "
                          "snapshots: needs storage.enabled).")
    host: str = Field("127.0.0.1", description="The broker's host name or address.")
    port: int = Field(1883, ge=1, le=65535, description="The broker's TCP port.")
    tls: MqttTlsSettings = Field(default_factory=MqttTlsSettings, description="TLS to the broker (off: plain TCP).")
    username: str | None = Field(None, description="User name, when the broker asks for one.")
    password: SecretStr | None = Field(None, description="Password (never logged, masked in `vigil config show`).")
    client_id: str = Field("vigil", min_length=1, description="MQTT client identifier; also Home Assistant's "
                           "device and unique-id prefix.")
    topic_prefix: str = Field("vigil", min_length=1, description="Every topic Vigil publishes starts with this.")
    discovery: bool = Field(True, description="Publish Home Assistant MQTT discovery configs (retained), so each "
                            "source's per-label sensors and snapshot cameras appear without YAML.")
    discovery_prefix: str = Field("homeassistant", min_length=1, description="Home Assistant's discovery prefix.")
    base_url: str | None = Field(
        None, description="The server's address as MQTT clients reach it (e.g. http://vigil.lan:8080): makes the "
        "snapshot and clip URLs in event payloads absolute; unset, they are paths.")
    snapshots: bool = Field(True, description="Publish each event's JPEG snapshot to <prefix>/<source>/<label>/"
                            "snapshot (retained), once it is written.")
    queue_messages: int = Field(
        1000, ge=1, description="Messages held while the broker is away (replayed on reconnect, in order); past "
        "this, new ones are dropped and counted in vigil_mqtt_dropped_total.")
    qos: int = Field(1, ge=0, le=1, description="QoS of every publish; 1: the broker acknowledges each message, "
                     "and one it never acknowledged is sent again after a reconnect.")
    keepalive_s: int = Field(30, ge=5, description="MQTT keep-alive; the broker publishes the last will (offline) "
                             "after 1.5 times this without a word from Vigil.")
    publish_timeout_s: float = Field(5.0, gt=0, description="How long an unacknowledged publish waits before the "
                                     "connection is treated as lost and the message is kept for the next one.")
    backoff_initial_s: float = Field(0.5, gt=0, description="First wait before reconnecting to the broker.")
    backoff_max_s: float = Field(30.0, gt=0, description="Longest wait between reconnection attempts.")

    @field_validator("topic_prefix", "discovery_prefix")
    @classmethod
    def _plain_topic(cls, value: str) -> str:
        value = value.strip("/")
        if not value or not _TOPIC_PART.match(value):
            raise ValueError("a topic prefix must be non-empty and hold no '#', '+' or NUL")
        return value
