"""pydantic's plugins found without ``importlib.metadata`` where no installed distribution declares one.

The first model pydantic builds asks :func:`pydantic.plugin._loader.get_plugins` for the ``pydantic`` entry points,
and that module imports ``importlib.metadata`` (and with it ``email``, ``zipfile``, ``csv``), then reads every
distribution's ``entry_points.txt``: ~60 M instructions, a tenth of ``commtax estimate``'s start-up, for the
answer "none" in almost every environment. Within :func:`plugins_found_cheaply`, when no distribution that
``importlib.metadata`` would find can declare a plugin, that module's name is held by a stand-in whose
``get_plugins`` answers the same (no plugins); any other of its names, and every use after the block, is the real
module's. The check is conservative: a folder on ``sys.path`` whose ``*.dist-info`` or ``*.egg-info`` holds an
``entry_points.txt`` that mentions ``pydantic`` anywhere, a zip file or ``.egg`` on ``sys.path``, an entry that is
not a string, an unreadable ``entry_points.txt``, or a distribution finder on ``sys.meta_path`` other than the
standard path finder, and pydantic loads its plugins itself, as before (a user's own plugin is never skipped).
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

LOADER = "pydantic.plugin._loader"


@contextmanager
def plugins_found_cheaply() -> Iterator[None]:
    """Within the block, pydantic's ``get_plugins`` answers "none" without ``importlib.metadata`` when
    :func:`may_declare_plugins` finds no distribution that could declare one; the stand-in is gone after."""
    if LOADER in sys.modules or may_declare_plugins():
        yield
        return
    stand_in = types.ModuleType(LOADER, "pydantic's plugin loader while no distribution declares a plugin")
    stand_in.get_plugins = no_plugins
    stand_in.__getattr__ = _real_loader_attribute  # any other name: the real module's (PEP 562)
    sys.modules[LOADER] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(LOADER) is stand_in:
            del sys.modules[LOADER]


def no_plugins() -> tuple:
    """``get_plugins()``'s answer where no distribution declares a ``pydantic`` entry point."""
    return ()


def _real_loader_attribute(name: str):
    if name.startswith("__") and name.endswith("__"):  # the import system asks for __path__ on `from ._loader import`
        raise AttributeError(f"module {LOADER!r} has no attribute {name!r}")
    import importlib

    sys.modules.pop(LOADER, None)
    return getattr(importlib.import_module(LOADER), name)


def may_declare_plugins() -> bool:
    """False only when no distribution ``importlib.metadata`` would find declares a ``pydantic`` entry point:
    every ``sys.path`` entry is a folder (or missing), none of its ``*.dist-info``/``*.egg-info`` holds an
    ``entry_points.txt`` mentioning ``pydantic``, and the only distribution finder is the standard path finder."""
    from importlib.machinery import PathFinder

    for finder in sys.meta_path:
        if finder is not PathFinder and getattr(finder, "find_distributions", None) is not None:
            return True
    for entry in sys.path:
        if not isinstance(entry, str) or os.path.basename(entry).lower().endswith(".egg"):
            return True
        try:
            names = os.listdir(entry or ".")
        except NotADirectoryError:  # a zip file: importlib.metadata reads the distributions inside
            return True
        except OSError:  # missing or unreadable: importlib.metadata finds nothing there either
            continue
        for name in names:
            if name.lower().endswith((".dist-info", ".egg-info")):
                try:
                    with open(os.path.join(entry, name, "entry_points.txt"), "rb") as fh:
                        if b"pydantic" in fh.read().lower():
                            return True
                except (FileNotFoundError, NotADirectoryError):  # no entry points, or an egg-info file
                    continue
                except OSError:
                    return True
    return False
