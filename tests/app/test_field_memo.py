"""app/web/field_memo.py: routes that declare the same parameter share one validator, and only
those; what a request gets back is what each declaration says."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Path, Query
from fastapi.testclient import TestClient

from app.auth.route_table import _walk
from app.web import field_memo


def _adapter(app: FastAPI, path: str, kind: str = "query_params") -> Any:
    route = next(r for p, r in _walk(app.routes, "") if p == path)
    (field,) = getattr(route.dependant, kind)
    return field._type_adapter


def test_equal_declarations_share_a_validator_and_different_ones_do_not() -> None:
    field_memo.install()
    app = FastAPI()

    @app.get("/int-1")
    def int_1(x: int = Query(1)) -> int:
        return x

    @app.get("/int-1-again")
    def int_1_again(x: int = Query(1)) -> int:
        return x

    @app.get("/bool-true")  # True == 1, but not the same default
    def bool_true(x: bool = Query(True)) -> bool:
        return x

    @app.get("/int-1-ge-0")
    def int_1_ge_0(x: int = Query(1, ge=0)) -> int:
        return x

    @app.get("/float-1")
    def float_1(x: float = Query(1.0)) -> float:
        return x

    @app.get("/list")  # an unhashable default: a validator of its own
    def listed(x: list[int] = Query([1])) -> list[int]:
        return x

    @app.get("/items/{item_id}")
    def item(item_id: Annotated[int, Path()]) -> int:
        return item_id

    @app.get("/other/{item_id}")
    def other(item_id: Annotated[int, Path()]) -> int:
        return item_id

    assert _adapter(app, "/int-1") is _adapter(app, "/int-1-again")
    assert _adapter(app, "/items/{item_id}", "path_params") is _adapter(app, "/other/{item_id}", "path_params")
    distinct = [_adapter(app, p) for p in ("/int-1", "/bool-true", "/int-1-ge-0", "/float-1", "/list")]
    assert len({id(a) for a in distinct}) == len(distinct)

    with TestClient(app) as c:
        assert c.get("/int-1", params={"x": "-3"}).json() == -3
        assert c.get("/int-1-again").json() == 1
        assert c.get("/bool-true", params={"x": "no"}).json() is False
        assert c.get("/int-1-ge-0", params={"x": "-3"}).status_code == 422
        assert c.get("/int-1-ge-0", params={"x": "7"}).json() == 7
        assert c.get("/float-1", params={"x": "2.5"}).json() == 2.5
        assert c.get("/int-1", params={"x": "2.5"}).status_code == 422
        assert c.get("/list", params=[("x", "4"), ("x", "5")]).json() == [4, 5]
        assert c.get("/list").json() == [1]
        assert c.get("/other/12").json() == 12
        assert c.get("/items/twelve").status_code == 422


def test_a_second_app_reuses_the_first_apps_validators(app: Any) -> None:
    """The app's own routes: a second app (a test's, or a second `create_app` in one process)
    builds no validator the first one built."""
    from app.main import create_app

    again = create_app(app.state.ctx.settings, engine=app.state.ctx.engine, start_jobs=False)

    from fastapi._compat import v2

    def fields(a: FastAPI) -> list[Any]:
        return [f for _, r in _walk(a.routes, "") for f in (*r.dependant.path_params, *r.dependant.query_params)]

    pairs = list(zip(fields(app), fields(again), strict=True))
    assert len(pairs) > 50 and all(f.name == g.name for f, g in pairs)
    # Equal declarations share (a pattern's metadata object compares by identity: not equal).
    equal = [(f, g) for f, g in pairs if field_memo._key(v2, f) == field_memo._key(v2, g) is not None]
    assert len(equal) > 0.9 * len(pairs)
    assert all(f._type_adapter is g._type_adapter for f, g in equal)
