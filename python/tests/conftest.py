import sys
from pathlib import Path

# The worker package lives in python/; the test helpers sit next to this file.
HERE = Path(__file__).resolve().parent
for path in (HERE.parent, HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import os  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors; it
# must be chosen before any kernel is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small tensors: one thread is fastest, and far faster on a busy machine (use per module)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
