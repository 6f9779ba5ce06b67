"""llama.cpp's log lines, routed to Python's ``logging`` (logger ``fastspec.llama``).

They are off by default.  ``fastspec.set_verbosity("info")`` (or the environment
variable ``FASTSPEC_VERBOSITY=info``) turns them on at that level.
"""
from __future__ import annotations

import logging
import os

from . import _core

logger = logging.getLogger("fastspec.llama")
_GGML_LEVELS = {"debug": 1, "info": 2, "warning": 3, "error": 4}
_TO_LOGGING = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


def _sink(level: int, text: str) -> None:
    text = text.rstrip("\n")
    if text:
        logger.log(_TO_LOGGING.get(level, logging.INFO), "%s", text)


def set_verbosity(level: str | None) -> None:
    """Show llama.cpp's messages at ``level`` ('debug', 'info', 'warning', 'error') and
    above through the ``fastspec.llama`` logger; ``None`` silences them."""
    if level is None:
        _core.set_log_level(99, None)
        return
    try:
        ggml_level = _GGML_LEVELS[level.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"level must be one of {sorted(_GGML_LEVELS)} or None, got {level!r}") from None
    if not logging.getLogger().handlers and not logger.handlers:
        logging.basicConfig(format="%(name)s: %(message)s")
    logger.setLevel(_TO_LOGGING[ggml_level])
    _core.set_log_level(ggml_level, _sink)


if os.environ.get("FASTSPEC_VERBOSITY"):
    set_verbosity(os.environ["FASTSPEC_VERBOSITY"])
