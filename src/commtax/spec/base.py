"""The spec's base: frozen pydantic models that refuse unknown fields, precisions, element sizes, the catalog folder."""

from __future__ import annotations

import functools
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


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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
    if spec.__pydantic_extra__ is not None or spec.__pydantic_private__ is not None:
        return spec.model_copy(update=changes)
    cls = type(spec)
    copied = cls.__new__(cls)
    values = spec.__dict__.copy()
    values.update(changes)
    _set(copied, "__dict__", values)
    _set(copied, "__pydantic_extra__", None)
    _set(copied, "__pydantic_fields_set__", spec.__pydantic_fields_set__ | changes.keys())  # a new set
    _set(copied, "__pydantic_private__", None)
    return copied


_set = object.__setattr__


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
    if last is not None and len(last[0]) == len(specs) and all(x is y for x, y in zip(last[0], specs)):
        return last[1]
    key = make(*specs)
    _LAST_KEYS[kind] = (specs, key)
    return key
