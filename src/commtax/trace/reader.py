"""Streaming reader of PyTorch profiler (Kineto) Chrome-trace files, plain or gzip.

A Kineto trace is one JSON object ``{"schemaVersion": …, "distributedInfo": {…}, "traceEvents": [ … ]}``
(or, in the older Chrome format, a bare array of events). The events array is read one element
at a time with ``json.JSONDecoder.raw_decode`` over a sliding text buffer, so memory stays at the
buffer (``CHUNK_CHARS``) plus what the caller keeps of each event — a 1 GB trace never sits in memory
(benchmarks/bench_trace.py measures it). No dependency beyond the standard library.

Malformed input raises ``TraceFormatError`` whose message names the file and the problem.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from commtax.errors import SpecError

CHUNK_CHARS = 1 << 20  # text read per refill
MAX_EVENT_CHARS = 64 << 20  # one event larger than this is taken as a malformed file (it would otherwise fill memory)
MAX_TRACE_CHARS = 4 << 30  # text per file (after gunzip): beyond it the file is refused (a gzip bomb stops here)
# gunzipped text per compressed byte: Kineto traces compress 10-20x; past 64 MiB of text a ratio over this is
# a gzip bomb (runs of one byte), refused before it costs minutes of CPU
MAX_GZIP_RATIO = 200
MAX_EVENTS = 20_000_000  # events per file: ~5x a 1 GB Kineto trace; more is refused, not parsed for minutes
KEPT_METADATA = ("distributedInfo", "deviceProperties", "schemaVersion", "traceName")
_WS = re.compile(r"[ \t\n\r]*")


class _BadNumber(ValueError):
    """A JSON number a trace cannot hold (NaN, ±Infinity, 1e999, an integer beyond int64)."""


def _constant(name: str) -> Any:
    raise _BadNumber(f"{name} is not a number a trace can hold (times and sizes are finite)")


_DECODER = json.JSONDecoder(parse_constant=_constant)  # the C scanner: NaN/Infinity refused, numbers native
_INT64 = 2**63


def _check_numbers(obj: Any, depth: int = 0) -> None:
    """An event's numbers (its fields and its args', two levels) are finite and within int64: 1e999 parses as
    inf and a 30-digit correlation id as a Python int, neither of which the figures can use."""
    for v in obj.values() if isinstance(obj, dict) else ():
        t = type(v)
        if t is float:
            if v - v != 0.0:  # inf or nan
                raise _BadNumber(f"{v} is not a finite number (times and sizes are finite)")
        elif t is int:
            if not -_INT64 <= v < _INT64:
                raise _BadNumber(f"integer {str(v)[:24]}… is beyond int64")
        elif t is dict and depth < 1:
            _check_numbers(v, depth + 1)


class TraceFormatError(SpecError):
    """A trace file that cannot be read: the message names the file and what is wrong with it."""


@dataclass
class TraceMeta:
    """The top-level fields of a trace other than its events (filled while the events stream)."""

    path: Path
    fields: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    bare_array: bool = False  # the old Chrome format: no metadata, no traceEvents key
    saw_events_key: bool = False


def _open_text(path: Path) -> TextIO:
    st = os.stat(path)  # never blocks: a FIFO is refused here, not opened (open() would wait for a writer)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(path)
    if not stat.S_ISREG(st.st_mode):
        kind = "FIFO" if stat.S_ISFIFO(st.st_mode) else "device or socket"
        raise TraceFormatError(f"{path}: is a {kind}, not a trace file; save the trace to a file first")
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


class _Buffer:
    """A window onto the file's text: ``text[pos:]`` is unread; ``fill`` appends the next chunk."""

    def __init__(self, stream: TextIO, path: Path):
        self.stream, self.path = stream, path
        self.text, self.pos, self.eof = "", 0, False
        self.read_chars = 0

    def fail(self, problem: str) -> TraceFormatError:
        return TraceFormatError(f"{self.path}: {problem}")

    def fill(self) -> None:
        if self.eof:
            return
        try:
            chunk = self.stream.read(CHUNK_CHARS)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise self.fail(f"truncated or corrupt gzip ({e})") from None
        except UnicodeDecodeError:
            raise self.fail("not a text (UTF-8 JSON) trace file") from None
        if not chunk:
            self.eof = True
        self.read_chars += len(chunk)
        self._check_ratio()
        if self.read_chars > MAX_TRACE_CHARS:
            raise self.fail(f"over {MAX_TRACE_CHARS >> 30} GiB of text (after gunzip): the limit per trace file")
        self.text = self.text[self.pos :] + chunk
        self.pos = 0

    def _check_ratio(self) -> None:
        raw = getattr(getattr(self.stream, "buffer", None), "fileobj", None)  # a GzipFile's compressed file
        if raw is None or self.read_chars < 64 << 20:
            return
        try:
            packed = raw.tell()
        except (OSError, ValueError):
            return
        if packed > 0 and self.read_chars / packed > MAX_GZIP_RATIO:
            raise self.fail(
                f"{self.read_chars / packed:,.0f}:1 gzip expansion after {self.read_chars >> 20} MiB: over the limit "
                f"of {MAX_GZIP_RATIO}:1 (profiler traces compress 10-20x); not a trace"
            )

    def skip_ws(self) -> str:
        """The next non-blank character ('' at the end of the file)."""
        while True:
            self.pos = _WS.match(self.text, self.pos).end()
            if self.pos < len(self.text):
                return self.text[self.pos]
            if self.eof:
                return ""
            self.fill()

    def expect(self, chars: str, where: str) -> str:
        c = self.skip_ws()
        if c == "" or c not in chars:
            found = "the end of the file" if c == "" else repr(c)
            raise self.fail(
                f"not a JSON trace: expected {' or '.join(repr(x) for x in chars)} {where}, found {found}"
                + (" (the file is cut short)" if c == "" else "")
            )
        self.pos += 1
        return c

    def value(self, what: str) -> Any:
        """Decode the next JSON value, reading more text until it is complete."""
        self.skip_ws()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.text, self.pos)
            except _BadNumber as e:
                raise self.fail(f"{what}: {e}") from None
            except RecursionError:
                raise self.fail(f"{what}: JSON nested too deep (a profiler writes a few levels)") from None
            except json.JSONDecodeError as e:
                if self.eof:
                    cut = e.pos >= len(self.text) - 1 or "Unterminated" in e.msg
                    raise self.fail(
                        f"{what}: "
                        + (
                            "the file is cut short mid-JSON"
                            if cut
                            else f"malformed JSON ({e.msg} at character {e.pos})"
                        )
                    ) from None
                if len(self.text) - self.pos > MAX_EVENT_CHARS:
                    raise self.fail(
                        f"{what}: malformed JSON ({e.msg}) or an event over {MAX_EVENT_CHARS >> 20} MiB"
                    ) from None
                self.fill()
                continue
            except ValueError:  # int() of more than 4,300 digits (JSONDecodeError is handled above)
                raise self.fail(f"{what}: an integer of over 4,300 digits, beyond int64") from None
            if end >= len(self.text) and not self.eof:  # a number or literal may go on in the next chunk
                self.fill()
                continue
            self.pos = end
            return obj


def iter_events(path: Path | str, meta: TraceMeta | None = None) -> Iterator[Any]:
    """Yield the elements of ``traceEvents`` one by one; top-level fields go to ``meta.fields``.

    Raises TraceFormatError for an empty file, text that is not JSON, a truncated gzip, a file cut
    mid-JSON, or a JSON document with no ``traceEvents`` array.
    """
    path = Path(path)
    meta = meta if meta is not None else TraceMeta(path)
    try:
        stream = _open_text(path)
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: is a directory") from None
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e.strerror})") from None
    with stream:
        buf = _Buffer(stream, path)
        buf.fill()
        first = buf.skip_ws()
        if first == "":
            raise buf.fail("empty file (no JSON trace in it)")
        if first == "[":
            meta.bare_array = meta.saw_events_key = True
            yield from _array(buf, meta)
            _end(buf)
            return
        if first != "{":
            raise buf.fail(f"not a JSON trace (starts with {buf.text[buf.pos : buf.pos + 20]!r})")
        buf.pos += 1
        if buf.skip_ws() == "}":
            buf.pos += 1
        else:
            while True:
                key = buf.value("a top-level key")
                if not isinstance(key, str):
                    raise buf.fail(f"not a JSON trace: top-level key {key!r} is not a string")
                buf.expect(":", f"after the key {key!r}")
                if key == "traceEvents":
                    if buf.skip_ws() != "[":
                        value = buf.value("traceEvents")
                        raise buf.fail(f"traceEvents is a {type(value).__name__}, expected a list of events")
                    meta.saw_events_key = True
                    yield from _array(buf, meta)
                else:
                    value = buf.value(f"the value of {key!r}")
                    if key in KEPT_METADATA:
                        meta.fields[key] = value
                if buf.expect(",}", "between top-level fields") == "}":
                    break
        if not meta.saw_events_key:
            raise buf.fail("no traceEvents array: not a PyTorch profiler (Kineto) trace")
        _end(buf)


def _end(buf: _Buffer) -> None:
    """Nothing but blanks may follow the top-level JSON value (two traces run together are not one)."""
    c = buf.skip_ws()
    if c != "":
        raise buf.fail(
            f"text after the top-level JSON ({buf.text[buf.pos : buf.pos + 20]!r}): one trace per file "
            "(two concatenated traces are not one)"
        )


def _array(buf: _Buffer, meta: TraceMeta) -> Iterator[Any]:
    buf.expect("[", "at the start of traceEvents")
    if buf.skip_ws() == "]":
        buf.pos += 1
        return
    while True:
        event = buf.value(f"traceEvents[{meta.events}]")
        try:
            _check_numbers(event)
        except _BadNumber as e:
            raise buf.fail(f"traceEvents[{meta.events}]: {e}") from None
        yield event
        meta.events += 1
        if meta.events > MAX_EVENTS:
            raise buf.fail(f"over {MAX_EVENTS:,} events: refused, the limit per trace file (give --steps a range)")
        if buf.expect(",]", f"after traceEvents[{meta.events - 1}]") == "]":
            return


def trace_files(paths: list[Path | str]) -> list[Path]:
    """The trace files named: files as given, directories expanded to their *.json / *.json.gz files (sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and q.name.endswith((".json", ".json.gz")))
            if not found:
                raise TraceFormatError(f"{p}: directory has no *.json or *.json.gz trace files")
            out.extend(found)
        elif not p.exists():
            raise TraceFormatError(f"{p}: file not found")
        else:
            out.append(p)
    return out
