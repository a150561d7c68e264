"""One "app process" handing rollouts to agents, for the double-claim test:

    python claim_worker.py DB_URL HOST_ID AGENT_ID ROUNDS GO_FILE OUT.json

Calls the controller's claim_for_host ROUNDS times (as every push of that agent would) once
GO_FILE appears, and writes the rollout ids it was handed to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> int:
    url, host_id, agent_id, rounds, go_file, out_file = sys.argv[1:7]
    from app.storage.engine import make_engine
    from app.storage.rollouts_store import claim_for_host

    engine = make_engine(url)
    with engine.connect():
        pass
    deadline = time.monotonic() + 60
    while not Path(go_file).exists():
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.002)
    got: set[int] = set()
    errors: list[str] = []
    for _ in range(int(rounds)):
        try:
            got.update(c["id"] for c in claim_for_host(engine, int(host_id), agent_id, time.time()))
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    engine.dispose()
    Path(out_file).write_text(json.dumps({"ids": sorted(got), "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
