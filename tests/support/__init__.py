"""Helpers shared by the tests: import them as ``from tests.support import lab, paths, ...``.

Fixtures live in tests/conftest.py; everything else a test needs from another file lives here."""
