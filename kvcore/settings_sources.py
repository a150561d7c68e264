"""Layered settings sources, standard library only: the one mechanism the app and the agent read
their settings through.

Sources, highest first: explicit overrides (command-line flags, a caller's arguments), the
environment (``KVSCOPE_*``), a TOML file, the defaults. Every setting has one place in a section
(``alerts.eval_interval_s``, written ``[alerts] eval_interval_s`` in TOML), one environment
variable, and, if it existed before the settings were nested, its old flat TOML key
(``alert_eval_interval_s``), which is still read so that an old config file keeps working.

The app validates the layered values with its pydantic models (app/settings.py); the agent, which
has no pydantic, with :class:`Field` (typed, range-checked). Either way an error names the
setting, where its value came from (the variable, the file's key, the flag) and what is allowed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# json and tomllib are imported where used: `kvscope agent --help` reads no file and no JSON
MAX_FILE_BYTES = 1024 * 1024  # a config file is a few KB; refuse reading anything that is not one
MAX_ENV_CHARS = 64 * 1024  # the longest environment value read (a JSON list of channels fits)


class SettingError(ValueError):
    """A bad setting: the message names the setting, where its value came from and what is allowed."""


@dataclass(frozen=True)
class Key:
    """Where one setting lives: ``section.name``, its environment variable, its old flat key."""

    section: str
    name: str
    env: str
    flat: str | None = None  # the TOML key (and override name) it had before the settings were nested
    json: bool = False  # a list or table: its environment value is JSON

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"


@dataclass
class Layered:
    """The values the sources gave (raw: strings from the environment, TOML values from the file),
    by section, with where each came from, and the warnings to show once."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # "section.name" -> "KVSCOPE_X" / "[s] n in FILE"
    warnings: list[str] = field(default_factory=list)

    def get(self, key: Key, default: Any = None) -> Any:
        return self.values.get(key.section, {}).get(key.name, default)

    def where(self, path: str) -> str:
        return self.origin.get(path, "the default")


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML config file as a table; a missing, huge or malformed file is a SettingError."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SettingError(f"config file {path} not found: fix --config / KVSCOPE_CONFIG") from None
    except OSError as exc:
        raise SettingError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SettingError(f"config file {path} is over {MAX_FILE_BYTES // 1024} KB: is it the right file?")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingError(f"cannot read config file {path}: {exc}") from None


def config_path(given: str | Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The config file: the one given (--config), else $KVSCOPE_CONFIG, else none."""
    env = os.environ if environ is None else environ
    chosen = given or env.get("KVSCOPE_CONFIG")
    return Path(chosen).expanduser() if chosen else None


def layer(
    keys: Sequence[Key],
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    toml: Mapping[str, Any] | None = None,
    toml_name: str = "the config file",
    removed: Mapping[str, str] | None = None,
    other_sections: Iterable[str] = (),
    only_sections: Iterable[str] | None = None,
) -> Layered:
    """Layer the sources for `keys`: overrides > environment > TOML > (the caller's defaults).

    `overrides`: by flat name or ``section.name`` (None means not given). `removed`: old flat names
    that are no longer settings -> why (warned about, never an error: an upgraded host keeps its
    environment). `other_sections`: TOML sections another reader owns (skipped). `only_sections`:
    read only these sections of the file (the agent reads ``[agent]`` of a shared file).
    """
    env = os.environ if environ is None else environ
    gone = dict(removed or {})
    out = Layered()
    by_flat: dict[str, Key] = {k.flat: k for k in keys if k.flat}
    by_path = {k.path: k for k in keys}
    sections = {k.section for k in keys}
    only = set(only_sections) if only_sections is not None else None

    def put(key: Key, value: Any, where: str) -> None:
        out.values.setdefault(key.section, {})[key.name] = value
        out.origin[key.path] = where

    def put_file(key: Key, value: Any, where: str) -> None:
        if key.path in out.origin:
            raise SettingError(
                f"{key.flat} and [{key.section}] {key.name} both set in {toml_name}: keep the second (the old "
                "flat key is still read, the section is the documented form)"
            )
        put(key, value, where)

    # the file, lowest of the explicit sources
    for top, value in (toml or {}).items():
        if only is not None:
            if top in only and top in sections:
                _section(out, put_file, keys, top, value, toml_name, gone)
            continue
        if top in sections and isinstance(value, dict) and top not in by_flat:
            _section(out, put_file, keys, top, value, toml_name, gone)
        elif top in by_flat:
            put_file(by_flat[top], value, f"{top} in {toml_name}")
        elif top in gone:
            out.warnings.append(f"{top} in {toml_name} is no longer a setting ({gone[top]}); it is ignored")
        elif top not in set(other_sections):
            raise SettingError(f"unknown setting {top} in {toml_name}" + _near(top, by_flat, sections))

    for key in keys:
        raw = env.get(key.env)
        if raw is None:
            continue
        if len(raw) > MAX_ENV_CHARS:
            raise SettingError(f"{key.env} is over {MAX_ENV_CHARS} characters")
        put(key, _json(key, raw) if key.json else raw, key.env)
    for name, why in sorted(gone.items()):
        var = "KVSCOPE_" + name.upper()
        if var in env and var not in {k.env for k in keys}:
            out.warnings.append(f"{var} is no longer a setting ({why}); it is ignored")

    for name, value in (overrides or {}).items():
        if value is None:
            continue
        given = by_flat.get(name) or by_path.get(name)
        if given is None:
            raise SettingError(f"unknown setting {name!r}" + _near(name, by_flat, sections))
        put(given, value, f"the override {name}")
    return out


def _section(
    out: Layered, put: Any, keys: Sequence[Key], top: str, value: Any, toml_name: str, gone: Mapping[str, str]
) -> None:
    if not isinstance(value, dict):
        raise SettingError(f"[{top}] in {toml_name} must be a table of settings, not {type(value).__name__}")
    mine = {k.name: k for k in keys if k.section == top}
    for name, v in value.items():
        if name in mine:
            put(mine[name], v, f"[{top}] {name} in {toml_name}")
        elif f"{top}.{name}" in gone or name in gone:
            why = gone.get(f"{top}.{name}") or gone[name]
            out.warnings.append(f"[{top}] {name} in {toml_name} is no longer a setting ({why}); it is ignored")
        else:
            raise SettingError(
                f"unknown setting [{top}] {name} in {toml_name} (known: {', '.join(sorted(mine)) or 'none'})"
            )


def _near(name: str, by_flat: Mapping[str, Key], sections: set[str]) -> str:
    hits = [f for f in by_flat if f and (name in f or f in name)][:3]
    return (
        f" (did you mean {', '.join(str(h) for h in hits)}?)" if hits else f" (sections: {', '.join(sorted(sections))})"
    )


def _json(key: Key, raw: str) -> Any:
    import json

    try:
        return json.loads(raw)
    except ValueError as exc:
        raise SettingError(f'{key.env} must be JSON (e.g. ["a", "b"]): {exc}') from None


# --- typed fields, for readers without pydantic (the agent)

KINDS = ("str", "int", "float", "bool", "path", "str_list")
TRUE, FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class Field:
    """One typed setting: its key, kind, default and limits (numbers: lo..hi; text: max_len)."""

    key: Key
    kind: str
    default: Any
    help: str
    lo: float | None = None
    hi: float | None = None
    max_len: int | None = None
    max_items: int = 64

    def allowed(self) -> str:
        if self.kind in ("int", "float"):
            return (
                f"a number from {self.lo:g} to {self.hi:g}"
                if self.lo is not None and self.hi is not None
                else "a number"
            )
        if self.kind == "bool":
            return "true or false"
        if self.kind == "str_list":
            return f"one value or a JSON list of up to {self.max_items} strings"
        return f"text of up to {self.max_len} characters" if self.max_len else "text"

    def parse(self, raw: Any, where: str) -> Any:
        """`raw` (a string from the environment, a TOML value, an override) as this kind, in range."""
        try:
            value = self._convert(raw)
        except (TypeError, ValueError):
            raise SettingError(
                f"bad setting {self.key.path} (from {where}={_show(raw)}): must be {self.allowed()}"
            ) from None
        if self.kind in ("int", "float") and (
            not math.isfinite(value)
            or (self.lo is not None and value < self.lo)
            or (self.hi is not None and value > self.hi)
        ):
            raise SettingError(f"bad setting {self.key.path} (from {where}={_show(raw)}): must be {self.allowed()}")
        texts = value if isinstance(value, list) else [value] if isinstance(value, str) else []
        if self.kind == "str_list" and len(texts) > self.max_items:
            raise SettingError(f"bad setting {self.key.path} (from {where}): at most {self.max_items} values")
        limit = self.max_len or 4096
        if any(len(t) > limit for t in texts) or (isinstance(value, Path) and len(str(value)) > limit):
            raise SettingError(f"bad setting {self.key.path} (from {where}): longer than {limit} characters")
        return value

    def _convert(self, raw: Any) -> Any:
        if self.kind == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            return int(str(raw).strip()) if isinstance(raw, str) else int(raw)
        if self.kind == "float":
            if isinstance(raw, bool):
                raise ValueError(raw)
            return float(raw)
        if self.kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in TRUE or text in FALSE:
                return text in TRUE
            raise ValueError(raw)
        if self.kind == "path":
            if not isinstance(raw, str | Path) or not str(raw):
                raise ValueError(raw)
            return Path(os.path.expanduser(str(raw)))
        if self.kind == "str_list":
            import json

            if isinstance(raw, str):
                text = raw.strip()
                items = json.loads(text) if text.startswith("[") else [text]
            else:
                items = raw
            if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
                raise ValueError(raw)
            return list(items)
        if not isinstance(raw, str):
            raise ValueError(raw)
        return raw


def _show(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "..."


def resolve(fields: Sequence[Field], layered: Layered) -> dict[str, Any]:
    """Each field's value (by name): the layered value parsed and range-checked, else its default."""
    out: dict[str, Any] = {}
    for f in fields:
        raw = layered.get(f.key, _UNSET)
        out[f.key.name] = f.default if raw is _UNSET else f.parse(raw, layered.where(f.key.path))
    return out


_UNSET = object()
