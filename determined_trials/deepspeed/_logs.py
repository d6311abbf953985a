"""DeepSpeed's own log lines (its ``DeepSpeed`` logger, INFO by default: config dumps, timers, the
accelerator it picked) held below WARNING, so that a trial's output shows the trial's lines. Set
``$DET_DEEPSPEED_LOG_LEVEL`` (e.g. ``INFO``) to see them again."""

from __future__ import annotations

import logging
import os

__all__ = ["DEEPSPEED_LOGGER", "LOG_LEVEL_ENV", "quiet_deepspeed_logs"]

DEEPSPEED_LOGGER = "DeepSpeed"
LOG_LEVEL_ENV = "DET_DEEPSPEED_LOG_LEVEL"


class _Below(logging.Filter):
    """Drops records under a level. A filter, not ``setLevel``: DeepSpeed sets its logger's level when
    it is imported, but keeps the filters a logger already has."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


def _wanted_level() -> int:
    raw = os.environ.get(LOG_LEVEL_ENV, "").strip().upper()
    if not raw:
        return logging.WARNING
    level = logging.getLevelName(raw)
    if not isinstance(level, int):
        raise ValueError(f"${LOG_LEVEL_ENV}={raw!r} is not a logging level; use DEBUG, INFO, WARNING or ERROR")
    return level


def quiet_deepspeed_logs() -> None:
    """Hold DeepSpeed's log records below WARNING (or ``$DET_DEEPSPEED_LOG_LEVEL``); idempotent, and
    effective whether or not deepspeed was imported yet."""
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    level = _wanted_level()
    for existing in logger.filters:
        if isinstance(existing, _Below):
            existing.level = level
            return
    logger.addFilter(_Below(level))
