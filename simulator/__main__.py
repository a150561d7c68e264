"""`python -m simulator [vLLM flags]`: the same as `kvscope sim`."""

import sys

from simulator.config import make_parser
from simulator.runner import run

if __name__ == "__main__":
    sys.exit(run(make_parser().parse_args()))
