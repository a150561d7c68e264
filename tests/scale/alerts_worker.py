"""One "app process" of the alerts double-send test:

    python alerts_worker.py DB_URL WORKER GO_FILE OUT.json

Once GO_FILE appears it (1) tries to open the alert `key-race` (unique active key), (2) tries to
move alert 1 from version 1 by compare-and-set, (3) sends every due delivery it can claim, as
the delivery job does, and writes what it won to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> int:
    url, worker, go_file, out_file = sys.argv[1:5]
    from app.storage.alerts_store import (
        NewDelivery,
        TransitionRow,
        cas_update,
        claim_delivery,
        due_deliveries,
        finish_delivery,
        open_alert,
    )
    from app.storage.engine import make_engine

    engine = make_engine(url)
    with engine.connect():
        pass
    deadline = time.monotonic() + 60
    while not Path(go_file).exists():
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.002)
    now = time.time()
    errors: list[str] = []
    opened = None
    cas = False
    sent: list[int] = []
    try:
        opened = open_alert(
            engine,
            {
                "key": "key-race",
                "rule": "race",
                "state": "firing",
                "severity": "warning",
                "opened_at": now,
                "since": now,
                "last_eval": now,
                "message": f"opened by {worker}",
                "hints": [],
                "labels": {},
            },
            [TransitionRow(None, "firing", now, 1.0, "race")],
            [NewDelivery("webhook", "firing", {"by": worker})],
            now,
        )
        cas = cas_update(
            engine,
            1,
            1,
            {"state": "resolved", "resolved_at": now},
            [TransitionRow("firing", "resolved", now)],
            [NewDelivery("webhook", "resolved", {"by": worker})],
            now,
        )
        for _ in range(5):
            for d in due_deliveries(engine, time.time(), limit=500):
                if claim_delivery(engine, int(d["id"]), time.time(), lease_s=300):
                    sent.append(int(d["id"]))  # the notification would go out here
                    finish_delivery(engine, int(d["id"]), status="sent", now=time.time())
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
    engine.dispose()
    Path(out_file).write_text(json.dumps({"opened": opened, "cas": cas, "sent": sent, "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
