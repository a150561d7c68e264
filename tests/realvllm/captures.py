"""Capture a real server with `kvscope agent capture`, and keep tests/fixtures/vllm honest.

The committed files `tests/fixtures/vllm/real__vllm-0.32.0-cpu__*` are what the parser tests
(tests/agent) run on. A test captures the live server and checks that the committed file still
has the same shape (families, types, label names): if vLLM's output changed, the test fails and
says how to refresh the file: run the realvllm tests with KVSCOPE_REALVLLM_UPDATE_FIXTURES=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.realvllm.server import VLLM_VERSION

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "vllm"
PREFIX = f"real__vllm-{VLLM_VERSION}-cpu__"
UPDATE = os.environ.get("KVSCOPE_REALVLLM_UPDATE_FIXTURES") == "1"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
_LABEL_NAME = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def agent_capture(base_url: str, out_dir: Path) -> dict[str, Path]:
    """Run the real CLI; returns the written files by their endpoint name (metrics.prom, ...)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvscope.cli",
            "agent",
            "capture",
            str(out_dir),
            "--vllm-url",
            base_url,
            "--no-gpu",
            "--vllm-timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"kvscope agent capture failed ({proc.returncode}): {proc.stderr[-2000:]}"
    files = {p.name.split("__", 1)[1]: p for p in out_dir.iterdir() if p.name.startswith("vllm0__")}
    assert {"metrics.prom", "v1_models.json", "version.json"} <= set(files), sorted(files)
    return files


def shape(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Family -> (type, label names) of an exposition; `_created` families left out (their
    presence depends on the client library), and engine-generated families too."""
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            if not name.endswith("_created"):
                types[name] = kind.strip()
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            if not m:
                continue
            fam = _family(m.group(1), types)
            if fam is None:
                continue
            names = set(_LABEL_NAME.findall(m.group(2) or "")) - {"le", "quantile"}
            labels.setdefault(fam, set()).update(names)
    return {f: (t, frozenset(labels.get(f, set()))) for f, t in types.items()}


def _family(sample: str, types: dict[str, str]) -> str | None:
    if sample in types:
        return sample
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in types:
            return sample[: -len(suffix)]
    return None


def keep_or_compare(captured: Path, what: str, *, may_update: bool = True) -> Path:
    """With KVSCOPE_REALVLLM_UPDATE_FIXTURES=1 write the capture as the fixture `what`; otherwise
    assert the committed fixture has the capture's shape. Returns the fixture path.
    `may_update=False` for fixtures other tests pin values of (they are only compared)."""
    target = FIXTURES / f"{PREFIX}{what}"
    if UPDATE and may_update:
        shutil.copyfile(captured, target)
        return target
    assert target.exists(), f"{target} missing: run the realvllm tests with KVSCOPE_REALVLLM_UPDATE_FIXTURES=1"
    new, old = captured.read_text(), target.read_text()
    if what.endswith(".prom"):
        a, b = shape(new), shape(old)
        assert a == b, (
            f"{target.name} no longer matches the real server "
            f"(only live: {sorted(set(a.items()) - set(b.items()))[:10]}; "
            f"only committed: {sorted(set(b.items()) - set(a.items()))[:10]}): refresh it with "
            "KVSCOPE_REALVLLM_UPDATE_FIXTURES=1"
        )
    elif what.endswith(".json"):
        assert _keys(json.loads(new)) == _keys(json.loads(old)), f"{target.name}: fields differ from the live server"
    else:
        assert new == old, f"{target.name} differs from the live server"
    return target


def _keys(data: Any) -> Any:
    """The field structure of a JSON document (keys and nesting, not values)."""
    if isinstance(data, dict):
        return {k: _keys(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_keys(data[0])] if data else []
    return type(data).__name__
