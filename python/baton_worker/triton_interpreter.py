"""Triton's interpreter (TRITON_INTERPRET=1): the kernels run on CPU tensors,
op by op in NumPy. The tests use it where there is no GPU."""

from __future__ import annotations

import os


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _scalars_as_ints() -> None:
    """Triton 3.6's interpreter holds a scalar as a 1-element array and takes
    int() of it for range() bounds, which NumPy 2.4 refuses; read the element."""
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


if interpreted():
    _scalars_as_ints()
