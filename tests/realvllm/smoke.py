"""Start the real `vllm serve` once, wait for /health, print how long it took, stop it.

    python smoke.py [CACHE_HOME] [extra vllm flags...]

Used by `setup.sh --smoke` and by hand to measure start-up times (docs/realvllm.md).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server import Install, Server, default_install, http_get


def main(argv: list[str]) -> int:
    install = Install(Path(argv[1])) if len(argv) > 1 else default_install()
    problem = install.problem()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="kvscope-realvllm-smoke-") as job:
        server = Server(install, Path(job), tuple(argv[2:]))
        try:
            server.start()
            took = server.wait_healthy()
            status, _, body = http_get(server.url + "/version")
            print(f"vllm serve healthy after {took:.1f} s; /version {status} {body.decode()[:80]}")
        except RuntimeError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        finally:
            t0 = time.monotonic()
            notes = server.stop()
            print(f"stopped in {time.monotonic() - t0:.1f} s {'; '.join(notes)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
