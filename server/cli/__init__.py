"""The `vigil` command (main.py: serve, config show, analyze, replay, transcribe, export-detector, drain) and the
WebRTC client library (client.py) used by `vigil replay`, the tests and the benchmarks."""
