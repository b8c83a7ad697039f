"""Progress bars: on a terminal and in Jupyter, never in logs and CI output.

``tqdm.auto`` draws a widget in a notebook, but its ``disable=None`` ("only on a TTY") hides it
there, since a notebook's output stream is not a TTY; this asks the right question.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Optional


def in_notebook() -> bool:
    """Running inside a Jupyter (IPython) kernel."""
    shell = sys.modules.get("IPython")
    if shell is None or "ipykernel" not in sys.modules:
        return False
    ipython = getattr(shell, "get_ipython", lambda: None)()
    return ipython is not None and type(ipython).__name__ == "ZMQInteractiveShell"


def progress(
    iterable: Optional[Iterable] = None, *, total: Optional[int] = None, desc: str = "", enabled: bool = True, **options
):
    """A ``tqdm.auto`` bar: shown in notebooks and on terminals; off when ``enabled`` is False
    (e.g. on the non-main ranks of a multi-process run) or when output goes to a file."""
    from tqdm.auto import tqdm

    disable = True if not enabled else (False if in_notebook() else None)
    return tqdm(iterable, total=total, desc=desc, disable=disable, **{"leave": False, "dynamic_ncols": True, **options})


def human_count(count: int) -> str:
    """A parameter count as people read it in tables: 22700000 -> '22.7M', 41000 -> '41.0K'."""
    return f"{count / 1e6:.1f}M" if count >= 1e5 else f"{count / 1e3:.1f}K"


def human_duration(seconds: float) -> str:
    """A duration as people read it: 0.4 s, 12 s, 3 min 05 s, 1 h 02 min."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
