"""The settings shape of one notification channel (settings.alerts.channels). In TOML:

[[alerts.channels]]
name = "ops"
kind = "alertmanager"          # webhook | ntfy | slack | discord | alertmanager
url = "http://127.0.0.1:9093"  # Alertmanager base URL; a full URL for the others
min_severity = "warning"
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ChannelKind = Literal["webhook", "ntfy", "slack", "discord", "alertmanager"]
Severity = Literal["info", "warning", "critical"]
SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class AlertChannel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., description="Unique name, shown in the UI (letters, digits, _ . -).")
    kind: ChannelKind
    url: str = Field(..., description="http(s) URL: webhook URL, ntfy topic URL, or Alertmanager base URL.")
    enabled: bool = True
    min_severity: Severity = "info"
    rules: list[str] = Field(default_factory=list, description="Only these rules (empty: all).")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers (e.g. Authorization).")
    timeout_s: float = Field(5.0, gt=0, le=60)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("channel name must be 1-64 letters, digits, '_', '.' or '-'")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip()
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError("channel url must start with http:// or https://")
        return v

    def wants(self, rule: str, severity: str) -> bool:
        if not self.enabled:
            return False
        if self.rules and rule not in self.rules:
            return False
        return SEVERITY_ORDER.get(severity, 1) >= SEVERITY_ORDER[self.min_severity]
