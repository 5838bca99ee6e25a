"""The spec's base: frozen pydantic models that refuse unknown fields, precisions, element sizes, the catalog folder."""

from __future__ import annotations

import functools
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    model_validator,
)

from commtax.spec.wire_dtypes import COMM_DTYPES

CATALOG_DIR = Path(__file__).parents[1] / "catalog"
Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "int8"]
# gradient communication formats: fp32 … int4 (scaled per chunk), fp8_e4m3/e5m2, powersgd_rN; bytes in comm_dtypes
CommDtype = Literal[COMM_DTYPES]  # type: ignore[valid-type]
BYTES_PER = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}  # element sizes


def plain_attribute_reads(cls: type[BaseModel]) -> type[BaseModel]:
    """``cls`` with CPython's plain attribute lookup (``PyObject_GenericGetAttr``) instead of the ``__getattr__`` hook
    pydantic's BaseModel defines, where that hook can never answer: a model with no private attributes and no extra
    fields. Reads find the same values (the instance's ``__dict__``, the class's descriptors) and a missing name
    raises the same AttributeError, but a read skips the hook's type lookups and the interpreter can specialise it
    (CPython does not for a type with a hook): -18% of the instructions of an ``estimate``, -12% of a search.

    Done only where the type object's layout is the one checked here (``object``'s ``tp_getattro``, where it is read,
    is the address of ``PyObject_GenericGetAttr``; ``cls``'s is BaseModel's hook), else ``cls`` is left as it is:
    slower, the same. A subclass gets the hook back when it is created: ``_Spec`` applies this to each."""
    if _GENERIC_GETATTR is None or cls.__private_attributes__ or cls.model_config.get("extra") == "allow":
        return cls
    slot = _getattro_slot(cls)
    if slot.value == _getattro_slot(BaseModel).value:  # pydantic's hook, inherited (not a __getattr__ of cls's own)
        slot.value = _GENERIC_GETATTR
    return cls


def _getattro_slot(cls: type) -> Any:
    """The type object's ``tp_getattro`` as a pointer cell: after PyObject_VAR_HEAD (3 words) and 15 words (tp_name
    ... tp_str)."""
    return _Pointer.from_address(id(cls) + 18 * _WORD)


def _generic_getattr() -> int | None:
    """The address of ``PyObject_GenericGetAttr`` where ``object``'s slot read by ``_getattro_slot`` holds it, else
    None (another interpreter or layout). ``_ctypes``' own pointer cell: the ``ctypes`` package costs ~3 ms to import,
    what a ``commtax estimate`` would pay."""
    global _Pointer, _WORD
    if sys.implementation.name != "cpython":
        return None
    try:
        import _ctypes

        class _Pointer(_ctypes._SimpleCData):  # ctypes.c_void_p
            _type_ = "P"

        _WORD = _ctypes.sizeof(_Pointer)
        generic = _ctypes.dlsym(_ctypes.dlopen(None), "PyObject_GenericGetAttr")
    except (ImportError, AttributeError, OSError):  # no _ctypes, no dlsym (Windows), no such symbol
        return None
    return generic if _getattro_slot(object).value == generic else None


_Pointer: Any = None
_WORD = 0
_GENERIC_GETATTR = _generic_getattr()


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        plain_attribute_reads(cls)

    @model_validator(mode="before")
    @classmethod
    def _strict_numbers(cls, data: Any) -> Any:
        """YAML ``true`` is not the number 1: a bool is accepted only where the field is a yes/no."""
        if isinstance(data, dict):
            for name in _number_fields(cls):
                v = data.get(name)
                if isinstance(v, bool):
                    raise ValueError(f"{name}: expected a number, got {str(v).lower()}")
        return data


_M = TypeVar("_M", bound=BaseModel)


def replaced(spec: _M, **changes: Any) -> _M:
    """``spec.model_copy(update=changes)``, to the last attribute, without pydantic's general path (a search copies
    ~10^4 plans and jobs): the fields' dict copied and updated, the set fields joined. Specs refuse extra fields
    and hold no private attributes; one that has them takes ``model_copy``. No validation: as ``model_copy``."""
    return replaced_with(spec, changes)


def replaced_with(spec: _M, changes: dict[str, Any]) -> _M:
    """``replaced(spec, **changes)`` from a dict of the changes (a caller that builds one: no keyword packing)."""
    if spec.__pydantic_extra__ is not None or spec.__pydantic_private__ is not None:
        return spec.model_copy(update=changes)
    values = spec.__dict__.copy()
    values.update(changes)
    fields_set = spec.__pydantic_fields_set__.copy()  # a new set (``set | dict.keys()`` takes a slower path)
    fields_set.update(changes)
    return unvalidated(type(spec), values, fields_set)


def unvalidated(cls: type[_M], values: dict[str, Any], fields_set: set[str]) -> _M:
    """An instance of spec class ``cls`` holding ``values`` (its own dict, taken as is) with no validation, as
    ``model_copy`` makes one: for a class with no extra fields and no private attributes."""
    made = _new(cls)  # a spec class has no __new__ of its own (nor has BaseModel)
    _set(made, "__dict__", values)
    _set(made, "__pydantic_extra__", None)
    _set(made, "__pydantic_fields_set__", fields_set)
    _set(made, "__pydantic_private__", None)
    return made


_set = object.__setattr__
_new = object.__new__


@functools.lru_cache(maxsize=256)
def _number_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of a spec class that refuse a bool, in field order (read once per class: a search validates
    ~10^4 plans)."""
    return tuple(name for name, f in cls.model_fields.items() if not allows_bool(f.annotation))


def allows_bool(annotation: Any) -> bool:
    args = get_args(annotation)
    return annotation is bool or annotation is Any or any(allows_bool(a) for a in args if a is not type(None))


@dataclass(frozen=True, eq=False)
class HashedOnce:
    """A spec (or a tuple of specs) as part of a cache key, its hash computed once: pydantic hashes a model field by
    field at each dict lookup (~20 nested hashes for a job's model, training and assumptions)."""

    value: object
    hashed: int

    def __hash__(self) -> int:
        return self.hashed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashedOnce) and self.hashed == other.hashed and self.value == other.value


# the last specs of each kind met and their key: held, so compared by identity (a frozen spec's value cannot change);
# the plans of a search or sweep share these objects and each key costs ~30 us to make anew
_LAST_KEYS: dict[str, tuple[tuple, Any]] = {}


def held_key(kind: str, specs: tuple, make: Callable[..., Any]) -> Any:
    """``make(*specs)``, made again only when ``specs`` are not the very objects met last for ``kind``."""
    last = _LAST_KEYS.get(kind)
    if last is not None and len(last[0]) == len(specs) and all(map(operator.is_, last[0], specs)):
        return last[1]
    key = make(*specs)
    _LAST_KEYS[kind] = (specs, key)
    return key
