import sys
from pathlib import Path

# the KV-event stream builders live beside the tests
sys.path.insert(0, str(Path(__file__).resolve().parent))
