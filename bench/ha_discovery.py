"""Vigil's Home Assistant MQTT discovery payloads checked against Home Assistant's own schemas.

    python -m bench.ha_discovery [--ha-python /work/main/.cache/ha-venv/bin/python]

Vigil's venv makes every kind of discovery config ``server.mqtt.messages`` publishes (a count sensor and a snapshot
camera per source and label, a detection switch per source, the alerts switch), for sources whose names need
sanitising too; a Home Assistant venv (``homeassistant`` from PyPI, on the Python it needs: 2025.4.4 is the last
release for Python 3.13.0, the newest here) validates each one as Home Assistant's MQTT discovery does: the topic
against its discovery-topic pattern, abbreviations expanded, then the platform's ``DISCOVERY_SCHEMA``
(``homeassistant.components.mqtt.<platform>``). Keys the schema silently drops (its ``extra=REMOVE_EXTRA``: an
option Home Assistant does not know) are a failure too. Prints one line per payload and exits 1 on any failure.

Set up the Home Assistant venv once (outside Vigil's, whose Python is 3.11):

    /root/.pyenv/versions/3.13.0/bin/python -m venv /work/main/.cache/ha-venv
    /work/main/.cache/ha-venv/bin/pip install homeassistant==2025.4.4

This file is also the validator: the Home Assistant venv runs it with ``--validate`` (payloads as JSON on stdin),
so that half imports nothing of Vigil's."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

HA_PYTHON = "/work/main/.cache/ha-venv/bin/python"
# Options newer than the Home Assistant this can install (its schema drops them silently), by the release that
# brought them: reported, not failed, when that release is newer than the one checking.
NEWER_OPTIONS = {"default_entity_id": "2025.10"}
SOURCES = ("hall", "Back Door", "porch/2")  # a plain name, one with a space, one with a topic separator
LABELS = ("person", "car")


def vigil_payloads() -> list[dict[str, Any]]:
    """Every discovery config Vigil publishes, for ``SOURCES`` x ``LABELS`` with snapshots on, as the publisher
    builds them."""
    from server.config.mqtt import MqttSettings
    from server.mqtt.messages import Topics, discovery_messages, switch_discovery, topic_level

    config = MqttSettings(enabled=True, snapshots=True)
    topics = Topics(config)
    prefix = topics.prefix
    messages = [switch_discovery(config, topics, "alerts", "Vigil alerts", f"{prefix}/alerts/set",
                                 f"{prefix}/alerts/state")]
    for name in SOURCES:
        source = topic_level(name)
        for label in LABELS:
            messages += discovery_messages(config, topics, source, label)
        messages.append(switch_discovery(config, topics, f"{source}_detect", f"{source} detection",
                                         f"{prefix}/{source}/detect/set", f"{prefix}/{source}/detect/state"))
    return [{"topic": m.topic, "payload": json.loads(m.payload), "retain": m.retain} for m in messages]


def validate(messages: list[dict[str, Any]], discovery_prefix: str = "homeassistant") -> list[tuple[str, str]]:
    """In the Home Assistant venv: (topic, "ok" or why not) per message, as its MQTT discovery would judge it."""
    import copy
    import importlib

    import voluptuous as vol
    from homeassistant.components.mqtt import discovery
    from homeassistant.const import __version__

    print(f"homeassistant {__version__}", file=sys.stderr)
    results = []
    for message in messages:
        topic = message["topic"]
        trimmed = topic.removeprefix(f"{discovery_prefix}/")
        match = discovery.TOPIC_MATCHER.match(trimmed)
        if match is None or match.end() != len(trimmed):
            results.append((topic, "illegal discovery topic"))
            continue
        if not message.get("retain"):
            results.append((topic, "not retained (Home Assistant would miss it after a restart)"))
            continue
        platform = match["component"]
        payload = copy.deepcopy(message["payload"])
        discovery._replace_all_abbreviations(payload)
        try:
            schema = importlib.import_module(f"homeassistant.components.mqtt.{platform}").DISCOVERY_SCHEMA
            validated = schema(payload)
        except vol.Invalid as error:
            results.append((topic, f"invalid: {error}"))
            continue
        except (ImportError, AttributeError) as error:
            results.append((topic, f"no such MQTT platform {platform}: {error}"))
            continue
        dropped = sorted(set(payload) - set(validated))
        newer = [k for k in dropped if k in NEWER_OPTIONS and _release(NEWER_OPTIONS[k]) > _release(__version__)]
        unknown = [k for k in dropped if k not in newer]
        device = set(payload.get("device") or {}) - set(validated.get("device") or {})
        unknown += [f"device.{k}" for k in sorted(device)]
        if unknown:
            results.append((topic, f"unknown keys dropped: {unknown}"))
            continue
        results.append((topic, "ok" + "".join(f"; {k} is newer ({NEWER_OPTIONS[k]}): not checked" for k in newer)))
    return results


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ha-python", default=HA_PYTHON, help="The Home Assistant venv's Python.")
    parser.add_argument("--validate", action="store_true", help="(internal) validate payloads read from stdin")
    args = parser.parse_args()
    if args.validate:
        print(json.dumps(validate(json.load(sys.stdin))))
        return 0
    messages = vigil_payloads()
    checked = subprocess.run([args.ha_python, __file__, "--validate"], input=json.dumps(messages), text=True,
                             capture_output=True, check=False)
    if checked.returncode != 0:
        print(checked.stderr[-3000:], file=sys.stderr)
        return 2
    results = json.loads(checked.stdout.strip().splitlines()[-1])
    version = next((line for line in checked.stderr.splitlines() if line.startswith("homeassistant ")), "?")
    print(f"Vigil's discovery payloads against {version}'s MQTT discovery schemas:")
    for topic, verdict in results:
        ok = verdict.startswith("ok")
        print(f"{'PASS' if ok else 'FAIL'}  {topic}" + ("" if verdict == "ok" else f"  {verdict.removeprefix('ok; ')}"))
    failed = sum(not verdict.startswith("ok") for _, verdict in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
