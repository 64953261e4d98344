"""Unit tests: pure logic and file checks, no models, no servers, no network; ``pytest tests/unit`` (``make
test-unit``) runs in seconds. Deliberately without fixtures: servers and test media are
``tests/integration/conftest.py``'s, which unit tests must not need.
"""
