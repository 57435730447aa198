import sys
from pathlib import Path

# The worker package lives in python/; the test helpers sit next to this file.
HERE = Path(__file__).resolve().parent
for path in (HERE.parent, HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small tensors: one thread is fastest, and far faster on a busy machine (use per module)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
