"""Reading job, catalog and cluster files with bounds: size, YAML nodes after aliases, nesting."""

from __future__ import annotations

import json
import marshal
import os
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

from commtax.errors import SpecError, excerpt

MAX_YAML_BYTES = 16 * 2**20  # far above any job, catalog or cluster file; /dev/zero stops here
MAX_YAML_NODES = 200_000  # nodes after expanding aliases: a 600-byte alias bomb expands to billions
MAX_YAML_DEPTH = 64  # nesting; job files need 4


def _refuse_fifo(path: Path | str, what: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return  # open() names the problem
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        kind = "FIFO" if stat.S_ISFIFO(mode) else "socket"
        raise SpecError(f"{path}: is a {kind}, not a {what}; save it to a file")


def read_text(path: Path | str, what: str = "file") -> str:
    """A user's text file, bounded in size, as UTF-8 (a BOM is dropped): anything else is one SpecError line.

    A FIFO or socket is refused before it is opened: open() would wait for a writer that may never come."""
    _refuse_fifo(path, what)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
    except ValueError:  # a NUL byte in the path
        raise SpecError(f"{excerpt(str(path))}: not a file name (it holds a NUL byte)") from None
    if len(raw) > MAX_YAML_BYTES:
        raise SpecError(f"{path}: larger than {MAX_YAML_BYTES // 2**20} MiB; not a {what}")
    if b"\x00" in raw[:8192] and raw[:2] not in (b"\xff\xfe", b"\xfe\xff"):
        raise SpecError(f"{path}: a binary file, not a {what}")
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise SpecError(f"{path}: is UTF-16 text; save it as UTF-8")
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(
            f"{path}: not UTF-8 text (Latin-1?): byte 0x{raw[e.start]:02x} at offset {e.start}; save it as UTF-8"
        ) from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number (JSON has no NaN or Infinity)")


def read_json(path: Path | str, what: str = "JSON file") -> object:
    """A user's JSON file, bounded as ``read_text``; NaN/Infinity, nesting too deep or bad JSON: one SpecError."""
    text = read_text(path, what)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise SpecError(f"{path}: JSON nested too deep; not a {what}") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError as e:  # NaN/Infinity, or an integer of over 4,300 digits
        raise SpecError(f"{path}: {e}") from None


_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present


class _StrictLoader(_Base):  # type: ignore[misc, valid-type]
    """Safe YAML that refuses duplicate keys (the last would silently win)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None,
                            None,
                            f"duplicate key {excerpt(key)} (first on line {seen[key].line + 1})",
                            key_node.start_mark,
                        )
                    seen[key] = key_node.start_mark
                except TypeError:  # an unhashable key: the base constructor says so
                    pass
        return super().construct_mapping(node, deep=deep)


def _check_size(root: Any) -> None:
    """Nodes and depth of the document with aliases expanded, computed without expanding (memoised)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    active: set[int] = set()
    while stack:
        node, done = stack.pop()
        k = id(node)
        if k in size and not done:
            continue
        kids = []
        if isinstance(node, yaml.SequenceNode):
            kids = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            kids = [x for pair in node.value for x in pair]
        if not done:
            if k in active:
                raise SpecError("a YAML alias refers to itself (a recursive structure)")
            active.add(k)
            stack.append((node, True))
            stack.extend((c, False) for c in kids if id(c) not in size)
            continue
        active.discard(k)
        size[k] = min(1 + sum(size[id(c)] for c in kids), MAX_YAML_NODES + 1)
        depth[k] = 1 + max((depth[id(c)] for c in kids), default=0)
        if size[k] > MAX_YAML_NODES:
            raise SpecError(f"expands to more than {MAX_YAML_NODES:,} values through aliases (a YAML alias bomb?)")
        if depth[k] > MAX_YAML_DEPTH:
            raise SpecError(f"nested deeper than {MAX_YAML_DEPTH} levels")


def read_yaml(path: Path) -> Any:
    """A YAML file, bounded (size, alias expansion, depth), strict (no duplicate keys), one SpecError line on error."""
    text = read_text(path, "YAML file")
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            _check_size(node)
        except SpecError as e:
            raise SpecError(f"{path}: {e}") from None
        data = loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError(
            f"{path}:{where} malformed YAML ({excerpt(str(getattr(e, 'problem', '') or e), 80, quote=False)})"
        ) from None
    except RecursionError:
        raise SpecError(f"{path}: nested deeper than {MAX_YAML_DEPTH} levels") from None
    finally:
        loader.dispose()
    if isinstance(data, dict):
        bad = [k for k in data if not isinstance(k, str)]
        if bad:
            raise SpecError(
                f"{path}: top-level key {excerpt(bad[0])} is not a name; keys are words like model, cluster"
            )
    return data


def read_catalog_yaml(path: Path) -> Any:
    """A file of the built-in catalog (``catalog/*.yaml``, shipped with the package), read by libyaml without the
    bounds and the duplicate-key check a user's file gets: half the time of :func:`read_yaml` on the files every
    ``estimate`` reads. The shipped files pass those checks: tests/test_catalog.py reads each both ways.

    The parsed value is kept beside the file as Python keeps byte code (``__pycache__/NAME.TAG.marshal``, stamped
    with the file's size and mtime, written unless ``PYTHONDONTWRITEBYTECODE``): loading it takes ~1% of parsing
    the YAML, which was ~50 ms of every ``commtax estimate``. A stale, damaged or unwritable cache is parsed anew."""
    cache = _catalog_cache(path)
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns)
    try:
        with open(cache, "rb") as fh:
            cached_stamp, data = marshal.loads(fh.read())
        if cached_stamp == stamp:
            return data
    except (OSError, EOFError, ValueError, TypeError):
        pass  # no cache yet, or one from another file or Python: parse
    with open(path, encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=_Base)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)
    if not sys.dont_write_bytecode:
        write_marshal_cache(cache, (stamp, data))
    return data


def _catalog_cache(path: Path) -> Path:
    return path.parent / "__pycache__" / f"{path.name}.{sys.implementation.cache_tag}.marshal"


def write_marshal_cache(cache: Path, value: Any) -> None:
    """Write ``marshal.dumps(value)`` to ``cache`` atomically (another process may read it meanwhile), best
    effort: skipped for a value marshal cannot keep (a YAML date) or a folder the user cannot write (an installed
    package); an OSError or a signal half-way leaves no temporary file behind. The catalog's parsed files and the
    estimate path's compiled code (``cli.compiled``) are kept this way."""
    try:
        blob = marshal.dumps(value)
    except ValueError:
        return
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(exist_ok=True)
        tmp.write_bytes(blob)
        os.replace(tmp, cache)
    except BaseException as e:  # an OSError, or a signal (Ctrl-C, SIGTERM) half-way
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # its folder is not one (a file named __pycache__)
            pass
        if not isinstance(e, OSError):
            raise
