"""Native (C++) library output that says nothing to a kdplug user, kept off the terminal.

PyTorch's C++ code writes some warnings straight to file descriptor 2, past Python's ``warnings``:
the ONNX exporter warns once per packed LSTM call that ``prim::PackPadded`` has no shape
inference, nine lines before export's first, although the exported graph is then checked against
PyTorch on real inputs. :func:`without_native_lines` drops such lines and passes every other one on.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

#: PyTorch's ONNX exporter on a packed (Bi)LSTM: no shape inference for the packing ops
PACKED_SEQUENCE_SHAPE_WARNINGS = (
    "shape inference of prim::PackPadded type is missing",
    "shape inference of prim::PadPacked type is missing",
)


@contextmanager
def without_native_lines(*fragments: str) -> Iterator[None]:
    """Run the block with file descriptor 2 set aside, then write back every line of it but those
    holding one of ``fragments``. Where stderr is no file descriptor (a notebook), nothing changes."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not any(fragment in line for fragment in fragments))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
