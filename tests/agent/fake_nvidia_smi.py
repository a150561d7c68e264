#!/usr/bin/env python3
"""A stand-in nvidia-smi for the agent's fallback reader (formats as in tests/fixtures/nvidia-smi).

FAKE_SMI_MODE: "ok" (default), "old" (driver < 590: no pcie.link.gen.gpucurrent), "nodriver",
"slowlms" (the long-lived `-lms` query prints nothing).
FAKE_SMI_LOG: a file; every invocation appends one line (tests count spawns).
"""

import os
import sys
import time

MODE = os.environ.get("FAKE_SMI_MODE", "ok")
ROWS = {
    "index": ["0", "1"],
    "uuid": ["GPU-0e4f7a92-31c8-5b6d-a9f0-7c2e18d4b653", "GPU-b7d20c6e-8a15-4f93-2e7b-d06a9c41f8e2"],
    "name": ["NVIDIA L40S", "NVIDIA L40S"],
    "memory.used": ["41873", "41805"],
    "memory.total": ["46068", "46068"],
    "utilization.gpu": ["100", "[N/A]"],
    "temperature.gpu": ["63", "60"],
    "power.draw": ["298.51", "[Not Supported]"],
    "pcie.link.gen.gpucurrent": ["4", "1"],
    "pcie.link.gen.current": ["4", "1"],
    "pcie.link.width.current": ["16", "16"],
    "pcie.link.gen.max": ["4", "4"],
    "pcie.link.width.max": ["16", "16"],
}
DMON = ["# gpu  rxpci  txpci ", "# Idx   MB/s   MB/s ", "    0    412  18934 ", "    1      -    377 "]


def main(argv: list[str]) -> int:
    log = os.environ.get("FAKE_SMI_LOG")
    if log:
        with open(log, "a") as f:
            f.write(" ".join(argv) + "\n")
    if MODE == "nodriver":
        print(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running."
        )
        return 9
    if argv and argv[0] == "dmon":
        for line in DMON:
            print(line, flush=True)
        while True:
            time.sleep(0.2)
            print("    0  21406    377 ", flush=True)
            print("    1  21118    365 ", flush=True)
    opts = dict(a.split("=", 1) if "=" in a else (a, "") for a in argv)
    if "--query-compute-apps" in opts:
        print("GPU-0e4f7a92-31c8-5b6d-a9f0-7c2e18d4b653, 4242, 40000")
        print("GPU-b7d20c6e-8a15-4f93-2e7b-d06a9c41f8e2, 4243, [N/A]")
        return 0
    fields = opts.get("--query-gpu", "").split(",")
    for f in fields:
        if f not in ROWS or (MODE == "old" and f == "pcie.link.gen.gpucurrent"):
            print(f'Field "{f}" is not a valid field to query.\n')
            return 2
    loop = "-lms" in opts
    if loop and MODE == "slowlms":
        time.sleep(600)  # the long-lived query stays silent (killed by the reader's close)
    while True:
        for i in range(2):
            print(", ".join(ROWS[f][i] for f in fields), flush=True)
        if not loop:
            return 0
        time.sleep(int(opts["-lms"]) / 1000)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
