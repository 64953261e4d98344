"""Unit tests: pure logic, no models, no servers, no network; ``pytest tests/unit`` runs in seconds.

Deliberately empty of fixtures: the parent ``tests/conftest.py`` builds servers and test media, which unit tests
must not need (run them with ``--confcutdir tests/unit`` to keep it from loading at all).
"""
