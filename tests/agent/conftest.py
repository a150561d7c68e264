import sys
from pathlib import Path

# the fake vLLM helper lives beside the tests
sys.path.insert(0, str(Path(__file__).resolve().parent))
