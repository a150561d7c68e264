"""The flag policy reads argv the way the installed vLLM does (no server: vLLM's own parser).

For every bypass of issue 14 that vLLM's `serve` parser accepts, the flag it really sets is the one
kvcore/flag_policy.py names in its refusal: underscores, abbreviations (vLLM leaves argparse's
allow_abbrev on), dotted JSON keys and short options are read alike."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from kvcore import flag_policy
from tests.security.test_flags import BYPASSES

PARSE = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
p = make_arg_parser(FlexibleArgumentParser())
base = vars(p.parse_args(["m"]))
out = {"allow_abbrev": p.allow_abbrev, "cases": []}
for extra in json.loads(sys.argv[1]):
    try:
        ns = vars(p.parse_args(["m", *extra]))
        changed = sorted(k for k, v in ns.items() if repr(v) != repr(base.get(k)) and k != "kv_transfer_config" or
                         (k == "kv_transfer_config" and v is not None))
        out["cases"].append({"extra": extra, "changed": changed})
    except BaseException as exc:  # argparse exits, config errors
        out["cases"].append({"extra": extra, "error": type(exc).__name__})
print(json.dumps(out))
"""


def _dest(flag: str) -> str:
    return {"-O": "optimization_level", "-tp": "tensor_parallel_size"}.get(flag) or flag.lstrip("-").replace("-", "_")


def test_vllms_parser_sets_the_flag_the_policy_names(realvllm_install: Any) -> None:
    cases = [extra for extra, _flag in BYPASSES]
    cp = subprocess.run(
        [str(realvllm_install.python), "-c", PARSE, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert cp.returncode == 0, cp.stderr[-2000:]
    out = json.loads(cp.stdout.strip().splitlines()[-1])
    assert out["allow_abbrev"] is True
    allowed = flag_policy.allowed_flags()
    parsed = 0
    for (extra, flag), case in zip(BYPASSES, out["cases"], strict=True):
        assert flag_policy.refusal(extra, allowed=allowed) is not None
        if "error" in case:
            continue  # vLLM refuses it too (a stray positional, a missing value, a missing file)
        parsed += 1
        want = "kv_transfer_config" if flag == "--kv-transfer-conf" else _dest(flag)
        assert want in case["changed"], (extra, case)
    assert parsed >= 10  # most bypasses are real: vLLM accepts them
