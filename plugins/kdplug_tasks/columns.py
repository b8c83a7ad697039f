"""Examples and file records stored column-wise, so that a split of a million sentences costs about
its text's own bytes plus a few bytes an example, not a Python object per example.

A list of :class:`~kdplug.types.Example` objects over Python strings takes about 600 bytes an
example beside the text; here every text of a column lives in one UTF-8 buffer with an array of
offsets, labels in a typed array, and an ``Example`` is made only when one is read.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Optional

from kdplug.types import Example


class TextColumn(Sequence[str]):
    """Strings appended one by one into one UTF-8 buffer; ``column[i]`` decodes one."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._ends = array("q")

    def append(self, text: str) -> None:
        # surrogatepass: a JSON file may hold a lone surrogate ("\ud800"), which must come back as it went in
        self._buffer += text.encode("utf-8", "surrogatepass")
        self._ends.append(len(self._buffer))

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]  # negative indices, and IndexError out of range
        start = self._ends[index - 1] if index else 0
        return self._buffer[start : self._ends[index]].decode("utf-8", "surrogatepass")

    @property
    def nbytes(self) -> int:
        return len(self._buffer) + self._ends.itemsize * len(self._ends)


class ExampleTable(Sequence[Example]):
    """A split's examples, stored column-wise (texts as :class:`TextColumn`, labels as an array).

    It reads like the list of examples it replaces: indexing, slicing (a list), iteration, ``len``,
    and equality with any sequence of the same examples."""

    def __init__(self, text_a: TextColumn, text_b: Optional[TextColumn], labels: array, size: Optional[int] = None):
        self.text_a, self.text_b, self.labels = text_a, text_b, labels
        self._size = len(text_a) if size is None else size  # a table may be the first ``size`` rows of its columns

    @classmethod
    def of(cls, examples: Iterable[Example]) -> Sequence[Example]:
        """``examples`` stored column-wise; returned as they are (a list) where they do not fit a
        table's columns: some with a second text and some without, or labels of mixed types."""
        examples = examples if isinstance(examples, Sequence) else list(examples)
        if isinstance(examples, ExampleTable) or not examples:
            return examples
        pairs = examples[0].text_b is not None
        kinds = {type(example.label) for example in examples}
        typecode = "q" if kinds == {int} else "d" if kinds == {float} else None
        if typecode is None or any((example.text_b is not None) != pairs for example in examples):
            return examples
        text_a, text_b = TextColumn(), TextColumn() if pairs else None
        labels = array(typecode)
        for example in examples:
            text_a.append(example.text_a)
            if text_b is not None:
                text_b.append(example.text_b)
            labels.append(example.label)
        return cls(text_a, text_b, labels)

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        index = range(self._size)[index]
        text_b = self.text_b[index] if self.text_b is not None else None
        return Example(text_a=self.text_a[index], label=self.labels[index], text_b=text_b)

    def __iter__(self) -> Iterator[Example]:
        return (self[i] for i in range(self._size))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._size and all(mine == theirs for mine, theirs in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        return f"ExampleTable({self._size} examples{', pairs' if self.text_b is not None else ''})"


class RecordTable:
    """A file's ``(line, {role: value})`` records (see :mod:`.tables`), stored column-wise: the text
    roles as :class:`TextColumn` (``str`` of each value, as examples take them), the other roles'
    values interned (a label column holds few distinct values), line numbers in an array."""

    def __init__(self, records: Iterable[tuple[int, dict[str, Any]]], text_roles: Sequence[str]) -> None:
        self.lines = array("q")
        self.texts: dict[str, TextColumn] = {}
        self.codes: dict[str, array] = {}
        self.values: dict[str, list[Any]] = {}
        interned: dict[str, dict[Any, int]] = {}
        for line, record in records:
            if not self.texts and not self.codes:  # the roles of the first record are every record's
                self.texts = {role: TextColumn() for role in record if role in text_roles}
                self.codes = {role: array("i") for role in record if role not in text_roles}
                self.values = {role: [] for role in self.codes}
                interned = {role: {} for role in self.codes}
            self.lines.append(line)
            for role, column in self.texts.items():
                column.append(str(record[role]))
            for role, codes in self.codes.items():
                value = record[role]
                key = _key(value)
                if key not in interned[role]:
                    interned[role][key] = len(self.values[role])
                    self.values[role].append(value)
                codes.append(interned[role][key])

    def __len__(self) -> int:
        return len(self.lines)

    def __bool__(self) -> bool:
        return len(self.lines) > 0

    def distinct(self, role: str) -> list[Any]:
        """Every value ``role`` takes, each once, in order of first appearance."""
        return list(self.values[role])

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for index, line in enumerate(self.lines):
            record = {role: column[index] for role, column in self.texts.items()}
            record.update({role: self.values[role][codes[index]] for role, codes in self.codes.items()})
            yield line, record


def _key(value: Any) -> Any:
    """``value`` as a dictionary key that tells ``True`` from ``1`` and takes lists and mappings."""
    try:
        hash(value)
    except TypeError:
        return ("json", json.dumps(value, sort_keys=True, default=str))
    return (type(value).__name__, value)
