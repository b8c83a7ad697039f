"""Lines a run both prints and keeps in its log.txt.

What the run prints itself (``echo``) would reach a terminal twice if it were also logged to the
console: such records carry ``extra=FILE_ONLY``, and the command line's console handler drops them
while the run directory's log.txt keeps them.
"""

from __future__ import annotations

import logging

#: ``log.info(message, extra=FILE_ONLY)``: for log.txt, not for the console (the run printed it already)
FILE_ONLY = {"kdplug_file_only": True}


def not_file_only(record: logging.LogRecord) -> bool:
    """The console handler's filter: every record but those the run printed already."""
    return not getattr(record, "kdplug_file_only", False)
