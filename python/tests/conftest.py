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


def _interpreter_scalars_as_ints() -> None:
    """Triton 3.6's interpreter holds a scalar as a 1-element array and takes
    int() of it for range() bounds, which NumPy 2.4 refuses; read the element."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_scalars_as_ints()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small tensors: one thread is fastest, and far faster on a busy machine (use per module)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
