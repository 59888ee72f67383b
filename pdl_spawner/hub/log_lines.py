"""Log lines of the hub process that quote at most :data:`LOGGED_CHARS` characters.

JupyterHub logs each request's URI (``log_request``), tornado a refusal's message, and
either may carry what a visitor sent: a query string of up to the header limit
(:data:`~pdl_spawner.hub.request_limits.MAX_HEADER_BYTES`), a name, a value. With
:func:`bound_log_lines` (called from ``jupyterhub_config.py``), every log record this
process makes says at most :data:`LOGGED_CHARS` characters: a longer message, its
arguments formatted in, is cut to its first :data:`LOGGED_CHARS` and says how long it
was. A traceback (``exc_info``) is left whole: it quotes the hub's code.
"""

from __future__ import annotations

import logging

#: The most characters of one log message (about 25 lines of a terminal).
LOGGED_CHARS = 2000


def shortened(message: str) -> str:
    """``message`` within :data:`LOGGED_CHARS`, saying its full length when cut."""
    if len(message) <= LOGGED_CHARS:
        return message
    return f"{message[:LOGGED_CHARS]}... ({len(message)} characters)"


def _bounded(make_record):
    def make(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format: the logging module's to report, when it emits
            return record
        if len(message) > LOGGED_CHARS:
            record.msg, record.args = shortened(message), None
        return record

    make.bounds_log_lines = True
    return make


def bound_log_lines() -> None:
    """From now on, every log record of this process says at most :data:`LOGGED_CHARS`
    characters (once: a second call changes nothing)."""
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "bounds_log_lines", False):
        logging.setLogRecordFactory(_bounded(factory))
