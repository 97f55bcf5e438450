import sys
from pathlib import Path

# Test helper modules (twin_testkit) live next to the tests that use them.
sys.path.insert(0, str(Path(__file__).parent / "twin"))
