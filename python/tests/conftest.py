import sys
from pathlib import Path

# The worker package lives in python/; the test helpers sit next to this file.
HERE = Path(__file__).resolve().parent
for path in (HERE.parent, HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
