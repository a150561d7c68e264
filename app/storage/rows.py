"""One way to turn a result row into a typed row: the store's TypedDict, keys in its order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

R = TypeVar("R")


def typed_row(kind: type[R], row: Mapping[Any, Any]) -> R:
    """The row of `kind` (a TypedDict of a store) from a result row's mapping: exactly the type's
    keys, in its order, so a row never carries a column its type does not name. A column the
    query did not select is a KeyError here, not a surprise in a reader."""
    return cast(R, {key: row[key] for key in kind.__annotations__})
