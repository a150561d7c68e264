"""Database ids in URLs: a path or query id outside the INTEGER columns' range is a 422 from the
parameter check, never a database error (SQLite raised OverflowError for 20 digits: a 500)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

MAX_DB_ID = 2**31 - 1  # INTEGER primary keys (PostgreSQL: 4 bytes; SQLite: 8)

DbId = Annotated[int, Path(ge=1, le=MAX_DB_ID, description="A database id (1 to 2^31-1).")]
OptionalDbIdQuery = Annotated[int | None, Query(ge=1, le=MAX_DB_ID, description="A database id (1 to 2^31-1).")]
