"""The code the estimate path's import compiles at run time, kept beside the byte code.

Importing the estimate path (pydantic, yaml, the spec) compiles source that no ``.pyc`` holds: each dataclass's
methods (``dataclasses`` builds ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and a frozen class's
``__setattr__``/``__delattr__`` as text and ``exec``s it, ~360 functions), the forward references of
pydantic-core's ~120 TypedDicts (``typing.ForwardRef`` compiles each annotation string), each named tuple's
``__new__`` (``collections.namedtuple`` ``eval``s it) and ~50 regular expressions (yaml's, email's, platform's).
That was a third of ``commtax estimate``'s start-up (913 -> 606 M instructions). Within :func:`compiled_once` these
come from a cache keyed by the source itself: the text a dataclass ``exec``s or a named tuple ``eval``s, the string
a forward reference compiles, a regular expression's pattern and flags. The cache holds what the interpreter's own
compiler made from that key (a regular expression's program is kept only once the pattern rebuilt from it equals
the one ``re`` compiled), so it cannot go stale: a class or pattern that changes is a new key, compiled as before.

The cache is one file, ``cli/__pycache__/compiled.TAG.marshal`` (``compiled.TAG.opt-N.marshal`` under ``-O``),
checked against the interpreter's version and optimisation level; it is written (atomically, whole: the keys this
run used) when they differ from the file's, unless ``PYTHONDONTWRITEBYTECODE`` is set, and skipped where the folder
is read-only. A missing, damaged or foreign file is compiled anew. The hooks are the modules' own names shadowed
for the duration (``dataclasses.exec``, ``collections.eval``, ``typing.compile``, ``re``'s internal ``compile``),
removed on the way out whatever happens. The file is trusted as the ``.pyc`` files beside it are: it lies in the
package's own ``__pycache__``.

This module has no ``from __future__`` import on purpose: ``exec``, ``eval`` and ``compile`` inherit the calling
code's future flags, and ``dataclasses``, ``collections`` and ``typing`` have none either, so what is compiled here
is what they compile (tests/test_cli_compiled.py compares the code objects).
"""

import builtins
import marshal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType

_OPT = f".opt-{sys.flags.optimize}" if sys.flags.optimize else ""  # as byte code is named: -O runs keep their own
_TAIL = f"{sys.implementation.cache_tag}{_OPT}.marshal"
CACHE = Path(__file__).parent / "__pycache__" / f"compiled.{_TAIL}"  # the plain estimate's
STAMP = (sys.version, sys.flags.optimize)  # code objects and regular-expression programs are the interpreter's own


def cache_for(command: str) -> Path:
    """``command``'s cache: the estimate's is :data:`CACHE`, another command's a file of its own beside it
    (``compiled.search.TAG.marshal``), so that running one command does not rewrite another's."""
    return CACHE if command == "estimate" else CACHE.with_name(f"compiled.{command}.{_TAIL}")


@contextmanager
def compiled_once(cache: Path = CACHE) -> Iterator[None]:
    """Within the block, what ``dataclasses``, ``collections``, ``typing`` and ``re`` compile from source comes from
    ``cache`` when it holds that source; on the way out (not after an error) the cache is rewritten with the sources
    the block used if they are not the ones it held."""
    compiler = _Compiler(*_load(cache))
    restore = compiler.install()
    try:
        yield
    finally:
        restore()
    if compiler.changed() and not sys.dont_write_bytecode:
        _write(cache, compiler.used_codes, compiler.used_patterns)


def _load(cache: Path) -> tuple[dict, dict]:
    try:
        with open(cache, "rb") as fh:
            stamp, codes, patterns = marshal.loads(fh.read())  # marshal.load(fh) reads string by string: ~10x
        if stamp == STAMP and type(codes) is dict and type(patterns) is dict:
            return codes, patterns
    except (OSError, EOFError, ValueError, TypeError):
        pass  # none yet, damaged, or another interpreter's: compile
    return {}, {}


def _write(cache: Path, codes: dict, patterns: dict) -> None:
    from commtax.spec.files import write_marshal_cache  # here, not at the top: yaml's import is what is cached

    write_marshal_cache(cache, (STAMP, codes, patterns))


class _Compiler:
    """The cached stand-ins for ``exec``, ``eval``, ``compile`` and ``re``'s compiler, and the keys they used."""

    def __init__(self, codes: dict, patterns: dict) -> None:
        import re

        self.codes, self.patterns = codes, patterns
        self.used_codes: dict = {}
        self.used_patterns: dict = {}
        self.re_compiler = getattr(re, "_compiler", None) or sys.modules.get("sre_compile")  # 3.10: sre_compile
        self.re_compile = getattr(self.re_compiler, "compile", None)
        self.re_debug = re.DEBUG

    def install(self):
        """Shadow ``exec`` in ``dataclasses``, ``eval`` in ``collections``, ``compile`` in ``typing`` and ``re``'s
        compiler; return the undo."""
        import collections
        import dataclasses
        import typing

        dataclasses.exec = self.exec
        collections.eval = self.eval
        typing.compile = self.compile
        if self.re_compile is not None:
            self.re_compiler.compile = self.compile_pattern

        def restore() -> None:
            vars(dataclasses).pop("exec", None)
            vars(collections).pop("eval", None)
            vars(typing).pop("compile", None)
            if self.re_compile is not None:
                self.re_compiler.compile = self.re_compile

        return restore

    def changed(self) -> bool:
        return self.used_codes.keys() != self.codes.keys() or self.used_patterns.keys() != self.patterns.keys()

    def code(self, source: str, filename: str, mode: str) -> CodeType:
        key = (source, filename, mode)
        code = self.codes.get(key)
        if type(code) is not CodeType:
            code = builtins.compile(source, filename, mode)
        self.used_codes[key] = code
        return code

    def exec(self, source, globals=None, locals=None, /, **kw):
        if type(source) is str and not kw:
            source = self.code(source, "<string>", "exec")
        return builtins.exec(source, globals, locals, **kw)

    def eval(self, source, globals=None, locals=None, /):
        if type(source) is str:
            source = self.code(source, "<string>", "eval")
        return builtins.eval(source, globals, locals)

    def compile(self, source, filename, mode, *args, **kw):
        if type(source) is str and type(filename) is str and type(mode) is str and not args and not kw:
            return self.code(source, filename, mode)
        return builtins.compile(source, filename, mode, *args, **kw)

    def compile_pattern(self, p, flags=0):
        if type(p) not in (str, bytes) or type(flags) is not int or flags & self.re_debug:
            return self.re_compile(p, flags)
        key = (p, flags)
        program = self.patterns.get(key)
        if program is not None:
            try:
                compiled = _sre_compile(p, program)
            except Exception:  # noqa: BLE001 - not a program this interpreter reads: compile it
                program = None
        if program is None:
            compiled = self.re_compile(p, flags)
            program = _program(self.re_compiler, p, flags, compiled)
        if program is not None:
            self.used_patterns[key] = program
        return compiled


def _sre_compile(pattern, program):
    import _sre

    flags, code, groups, groupindex, indexgroup = program
    return _sre.compile(pattern, flags, code, groups, groupindex, indexgroup)


def _program(re_compiler, p, flags: int, compiled) -> tuple | None:
    """What ``re``'s compiler hands ``_sre.compile`` for ``p`` (its steps, as ``re._compiler.compile`` takes them),
    kept only if the pattern rebuilt from it equals ``compiled`` (flags, program, groups); None otherwise."""
    try:
        parser = getattr(re_compiler, "_parser", None) or sys.modules["sre_parse"]
        parsed = parser.parse(p, flags)
        code = [int(op) for op in re_compiler._code(parsed, flags)]  # its opcodes are int subclasses
        state = parsed.state
        indexgroup = [None] * state.groups
        for k, i in state.groupdict.items():
            indexgroup[i] = k
        program = (flags | state.flags, code, state.groups - 1, dict(state.groupdict), tuple(indexgroup))
        rebuilt = _sre_compile(p, program)
    except Exception:  # noqa: BLE001 - another interpreter's internals: compile as before, cache nothing
        return None
    same = rebuilt == compiled and rebuilt.groups == compiled.groups and rebuilt.groupindex == compiled.groupindex
    return program if same else None
