"""Route building without rebuilding the same validators: one pydantic TypeAdapter per distinct
parameter declaration, shared by every FastAPI route (and every app) that declares it.

FastAPI makes a `ModelField` for each path, query and body parameter and each response model of
every route, and each one builds a pydantic `TypeAdapter` (a core schema, a validator and a
serializer): most of the time `create_app` takes. The app declares the same few parameters over
and over (`instance_id: Annotated[int, Path()]` on 19 routes, `start: float | None = None` on 12
...), and a process that builds many apps (the test suite) builds them all again each time.

A `TypeAdapter` is a pure function of what it is built from (the annotation, its metadata, the
field's attributes, the config) and is not changed after it is built, so fields whose inputs are
equal share one. Equal means the same objects by `==`, of the same types, with the same `repr`
(`1 == True` but they are not the same default); a field with an unhashable input, a config, or
a forward reference builds its own, as does every field if FastAPI's `ModelField` is not the one
this was written against (`install` then does nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

MAX_ENTRIES = 2048  # distinct declarations; the app has about 50

_memo: dict[Hashable, Any] = {}
_installed = False


def _key(fields: Any, field: Any) -> Hashable | None:
    if getattr(field, "config", None) is not None:
        return None
    parts = fields.asdict(field.field_info)
    annotation = parts["annotation"]
    if isinstance(annotation, str) or "ForwardRef" in repr(annotation):
        return None
    key = (
        (annotation, repr(annotation)),
        tuple((type(m), m, repr(m)) for m in parts["metadata"]),
        tuple(sorted((name, type(v), v, repr(v)) for name, v in parts["attributes"].items())),
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


def install() -> None:
    """Share TypeAdapters between equal FastAPI fields from now on, in this process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from fastapi._compat import v2 as fields
    except ImportError:
        return
    model_field = getattr(fields, "ModelField", None)
    build: Callable[[Any], None] | None = getattr(model_field, "__post_init__", None)
    if model_field is None or build is None or not callable(getattr(fields, "asdict", None)):
        return

    def post_init(self: Any) -> None:
        key = _key(fields, self)
        if key is not None:
            adapter = _memo.get(key)
            if adapter is not None:
                self._type_adapter = adapter
                return
        before = set(getattr(self, "__dict__", ()))
        build(self)
        # Shared only when building set nothing but the adapter: a FastAPI whose fields keep more
        # state per field than that is left to build every field itself.
        if (
            key is not None
            and set(getattr(self, "__dict__", ())) - before == {"_type_adapter"}
            and len(_memo) < MAX_ENTRIES
        ):
            _memo[key] = self._type_adapter

    model_field.__post_init__ = post_init
