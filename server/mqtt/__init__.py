"""MQTT: events, counts, snapshots and availability published to a broker, with Home Assistant discovery."""
