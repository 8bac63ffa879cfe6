"""Undo steps: what an operation made, to be taken back newest first if a later step fails."""

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Undo:
    """Cleanup steps ``(what, func)``, run newest first by :meth:`run`, which returns the errors.

    ``stop_at_failure``: stop at the first step that fails, so what is left stays consistent (a domain
    that could not be undefined keeps its disks, for ``virt.cleanup``); the steps not run are named in
    the errors. Otherwise every step runs and each failure is logged (``what`` names the operation)."""

    def __init__(self, stop_at_failure: bool = False, what: str = "cleanup") -> None:
        self.steps: list[tuple[str, Callable[[], Any]]] = []
        self.stop_at_failure = stop_at_failure
        self.what = what

    def add(self, what: str, func: Callable[[], Any]) -> None:
        self.steps.append((what, func))

    def run(self) -> list[str]:
        errors: list[str] = []
        while self.steps:
            what, func = self.steps.pop()
            try:
                func()
            except Exception as exc:  # noqa: BLE001 - reported, with what was left as it was
                errors.append(f"{what}: {exc}")
                if self.stop_at_failure:
                    left = [w for w, _f in reversed(self.steps)]
                    self.steps = []
                    return errors + ([f"left for virt.cleanup: {', '.join(left)}"] if left else [])
                log.error("%s: %s failed: %s", self.what, what, exc)
        return errors
