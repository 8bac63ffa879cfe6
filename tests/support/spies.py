"""Spies over real objects: the real thing answers, the spy only records what was asked of it."""


class Counting:
    """A real object (a libvirt connection, say) whose attribute lookups are recorded in order in ``calls``:
    a test asserts what a function asked of libvirt, and what it did not ask."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.real, name)
