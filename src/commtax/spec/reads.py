"""Results kept by the values a builder read of a job: no list of the fields it ignores, kept by hand.

A builder of a job's blocks reads a few of its plan's ~40 fields (and of its cluster, its properties), which ones
depending on the values met (``plan.selective_policy`` only under selective recompute). ``ReadsCache`` runs it once
on a stand-in for the job that records each attribute it reads and the value found, and files the result in a tree
of those reads: a later job walks the tree reading the same attributes in the same order, and meets the result
where it read the same values. Two plans differing only in fields the builder never read share one result; a field
it starts to read is in the key from then on. The builder must be a function of what it reads (and of the root key
its caller gives for what it does not trace): two walks that read differently after the same values raise.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


class _Read:
    """A node of the tree: the attribute paths read next, in order, and the subtree for each of their values (one
    path: its value; several: the tuple of them). A node made for a new walk reads all of its remaining paths at
    once; it is split where a later walk, after other values, reads otherwise."""

    __slots__ = ("paths", "read", "next")

    def __init__(self, paths: tuple[str, ...], nodes: dict[Hashable, Any] | None = None):
        self.paths = paths
        self.read = operator.attrgetter(*paths)  # dotted paths read in one C call ("plan.tp", "cluster.gpu.arch")
        self.next: dict[Hashable, Any] = {} if nodes is None else nodes

    def key(self, values: list[Hashable]) -> Hashable:
        """What ``read`` returns for ``values`` of ``paths``."""
        return values[0] if len(values) == 1 else tuple(values)

    def split(self, k: int) -> None:
        """Read the first ``k`` paths here, the others in a node below, each subtree moved under its values."""
        n = len(self.paths)
        tails: dict[Hashable, _Read] = {}
        for key, sub in self.next.items():
            values = list(key) if n > 1 else [key]
            tail = tails.get(head := self.key(values[:k]))
            if tail is None:
                tail = tails[head] = _Read(self.paths[k:])
            tail.next[tail.key(values[k:])] = sub
        self.__init__(self.paths[:k], tails)


# the types of most values read (``type(v) in``: a set lookup before ``isinstance`` of a spec)
_VALUE_TYPES = frozenset({int, float, str, bool, type(None), tuple, frozenset})


class _Trace:
    """One build's recording: the job, and each path it read with the value found, in the order first read."""

    __slots__ = ("job", "reads", "untraced")

    def __init__(self, job: Any, untraced: frozenset[str]):
        self.job = job
        self.reads: dict[str, Hashable] = {}
        self.untraced = untraced


class _Recorder:
    """A stand-in for a spec that records each attribute read of it in its ``_Trace``; a spec-valued attribute (the
    job's plan, its cluster's GPU) is a stand-in in turn. The job's names in ``untraced`` are passed through (the
    caller's root key stands for them). A read value is kept on the stand-in: later reads are plain ones."""

    def __init__(self, spec: BaseModel, prefix: str, trace: _Trace):
        object.__setattr__(self, "_recorder", (spec, prefix, trace))
        if not prefix:  # the job's untraced specs, read as they are
            self.__dict__.update((name, getattr(spec, name)) for name in trace.untraced)

    def __getattr__(self, name: str) -> Any:
        spec, prefix, trace = object.__getattribute__(self, "_recorder")
        value = getattr(spec, name)
        path = prefix + name
        # pydantic's isinstance runs hasattr, an AttributeError raised for each plain value: types checked first
        if type(value) not in _VALUE_TYPES and isinstance(value, BaseModel):
            value = _Recorder(value, path + ".", trace)
        elif callable(value):
            raise TypeError(f"a ReadsCache builder called {path}: only values read can key its result")
        elif path not in trace.reads:
            trace.reads[path] = value
        self.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{name}: a recorded spec is read-only")


def _trace_of(job: Any) -> _Trace | None:
    """The recording ``job`` stands in for, where it is an enclosing cache's stand-in for a job."""
    if type(job) is not _Recorder:
        return None
    spec, prefix, trace = object.__getattribute__(job, "_recorder")
    if prefix:
        raise TypeError(f"a ReadsCache is given {prefix[:-1]}, not a job")
    return trace


_MISSING = object()


def _note(reads: dict[str, Hashable], read: Iterable[tuple[str, Hashable]]) -> None:
    """Add to ``reads`` each path of ``read`` not read before, with its value."""
    for path, value in read:
        if path not in reads:
            reads[path] = value


def _common_length(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many leading paths ``a`` and ``b`` share."""
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class ReadsCache(Generic[T]):
    """``build(job)`` kept per root key and the values ``build`` read of ``job`` (attributes of the job and of its
    specs but the job's ``untraced``, which the root key must stand for); emptied when ``limit`` results are held.

    Called inside another such cache's build (``job`` its stand-in), it reads the job itself and passes its reads
    on to the enclosing recording, so that the outer result is keyed by them as well: the outer root key must then
    stand for this one's, and both leave the same names untraced."""

    def __init__(self, untraced: frozenset[str] = frozenset(), limit: int = 4096):
        self.untraced = untraced
        self.limit = limit
        self.size = 0
        self._roots: dict[Hashable, Any] = {}

    def get(self, root: Hashable, job: Any, build: Callable[[Any], T]) -> T:
        outer = _trace_of(job)
        if outer is not None:
            return self._get_within(outer, root, build)
        node = self._roots.get(root, _MISSING)
        try:
            while type(node) is _Read:
                node = node.next.get(node.read(job), _MISSING)
        except (AttributeError, TypeError):  # a path another walk read does not apply to this job (a spec unset)
            node = _MISSING
        if node is not _MISSING:
            return node
        trace = _Trace(job, self.untraced)
        result = build(_Recorder(job, "", trace))
        self._file(root, trace.reads, result)
        return result

    def _get_within(self, outer: _Trace, root: Hashable, build: Callable[[Any], T]) -> T:
        """``get`` inside an enclosing build: the reads of the walk that found the result, or of the build, noted
        in ``outer`` too (not those of a walk that missed: a node may read past where this job's walk turns)."""
        if outer.untraced != self.untraced:
            raise ValueError("a ReadsCache inside another must leave the same names untraced")
        job = outer.job
        node, walked = self._roots.get(root, _MISSING), []
        try:
            while type(node) is _Read:
                key = node.read(job)
                walked.append((node.paths, key))
                node = node.next.get(key, _MISSING)
        except (AttributeError, TypeError):
            node = _MISSING
        if node is not _MISSING:
            for paths, key in walked:
                _note(outer.reads, zip(paths, (key,) if len(paths) == 1 else key))
            return node
        trace = _Trace(job, self.untraced)
        result = build(_Recorder(job, "", trace))
        self._file(root, trace.reads, result)
        _note(outer.reads, trace.reads.items())
        return result

    def clear(self) -> None:
        self._roots.clear()
        self.size = 0

    def _file(self, root: Hashable, reads: dict[str, Hashable], result: T) -> None:
        """File ``result`` under ``reads`` from ``root``, splitting a node where this walk reads otherwise; a walk
        that reads otherwise after the same values raises (the builder is no function of its reads)."""
        if self.size >= self.limit:
            self.clear()
        paths, values = tuple(reads), list(reads.values())
        parent, key, i = self._roots, root, 0
        while i < len(paths):
            node = parent.get(key, _MISSING)
            if node is _MISSING:
                node = parent[key] = _Read(paths[i:])
            elif type(node) is not _Read:
                raise RuntimeError(f"ReadsCache: the builder read {paths[i]} where an earlier walk read no more")
            n = len(node.paths)
            k = n if paths[i : i + n] == node.paths else _common_length(paths[i : i + n], node.paths)
            if k == 0:
                raise RuntimeError(f"ReadsCache: the builder read {paths[i]} where an earlier walk read otherwise")
            if k < n:
                node.split(k)
            parent, key, i = node.next, node.key(values[i : i + k]), i + k
        if type(parent.get(key)) is _Read:
            raise RuntimeError("ReadsCache: the builder read less than an earlier walk with the same values")
        parent[key] = result
        self.size += 1
