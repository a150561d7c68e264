import sys
from pathlib import Path

# the KV-event stream builders live beside the tests; the simulator's drivers beside its tests
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "simulator"))
