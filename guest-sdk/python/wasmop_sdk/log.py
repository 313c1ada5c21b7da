"""Logging to the host.

In a module, lines go to the host's log, tagged with the module's name and the object being
reconciled (lines beyond the host's per-call budget are dropped and counted). Natively (pytest),
they go to stderr, and the testing harness collects them.
"""

from __future__ import annotations

import sys
from enum import IntEnum
from typing import Callable, Optional


class Level(IntEnum):
    """How important a line is."""

    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


def _stderr(level: Level, message: str) -> None:
    print(f"{level.name} {message}", file=sys.stderr)


def _default_sink() -> Callable[[Level, str], None]:
    try:
        from wit_world.imports import host  # only inside a component
    except ImportError:
        return _stderr

    def to_host(level: Level, message: str) -> None:
        host.log(host.LogLevel(int(level)), message)

    return to_host


_sink: Optional[Callable[[Level, str], None]] = None


def set_sink(sink: Optional[Callable[[Level, str], None]]) -> None:
    """Where lines go (the testing harness collects them); None restores the default."""
    global _sink
    _sink = sink


def log(level: Level, message: str) -> None:
    """Writes one line at ``level``."""
    global _sink
    if _sink is None:
        _sink = _default_sink()
    _sink(level, str(message))


def trace(message: str) -> None:
    """Writes a line at trace level."""
    log(Level.TRACE, message)


def debug(message: str) -> None:
    """Writes a line at debug level."""
    log(Level.DEBUG, message)


def info(message: str) -> None:
    """Writes a line at info level."""
    log(Level.INFO, message)


def warn(message: str) -> None:
    """Writes a line at warn level."""
    log(Level.WARN, message)


def error(message: str) -> None:
    """Writes a line at error level."""
    log(Level.ERROR, message)
