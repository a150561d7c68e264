"""One "app process" for the concurrency tests: its own engine and IngestWriter (exactly what
create_app builds), writing the batches of a JSON file once a start file appears.

    python ingest_worker.py DB_URL BATCHES.json GO_FILE OUT.json

Writes {"stored": n, "duplicate": n, "errors": [...]} to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> int:
    url, batches_file, go_file, out_file = sys.argv[1:5]
    from app.ingest.parse import parse_batch
    from app.storage.engine import make_engine
    from app.storage.ingest_store import IngestWriter

    engine = make_engine(url)
    writer = IngestWriter(engine)
    bodies = [json.dumps(b).encode() for b in json.loads(Path(batches_file).read_text())]
    with engine.connect():  # open the pool before the race starts
        pass
    deadline = time.monotonic() + 60
    while not Path(go_file).exists():
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.005)
    stored = duplicate = 0
    errors: list[str] = []
    for body in bodies:
        batch = parse_batch(body, time.time(), max_future_skew_s=1e12, max_past_age_s=1e12)
        for _attempt in range(5):  # an agent retries a failed push; count the failures
            try:
                res = writer.write(batch, time.time())
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                continue
            if res.duplicate:
                duplicate += 1
            else:
                stored += 1
            break
    engine.dispose()
    Path(out_file).write_text(json.dumps({"stored": stored, "duplicate": duplicate, "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
