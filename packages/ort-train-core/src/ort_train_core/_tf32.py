"""TF32 on CUDA: the ``use_tf32`` option of onnxruntime's CUDA provider for every session
ort-train makes, following torch's settings unless :func:`set_tf32` chose.

TensorFloat-32 rounds the float32 operands of matrix products and convolutions to 10 mantissa
bits on NVIDIA GPUs from Ampere on: faster, less precise. onnxruntime's CUDA provider uses it
by default; its one switch, the provider option ``use_tf32`` (onnxruntime 1.18 and later),
covers cuBLAS matrix products (MatMul, Gemm) and cuDNN convolutions together. torch has two,
with different defaults: ``torch.backends.cuda.matmul.allow_tf32`` (False) and
``torch.backends.cudnn.allow_tf32`` (True). One switch cannot follow both, so "follows torch"
means: TF32 only where torch would use it for every operator the switch covers, both of torch's
flags True. With torch's defaults TF32 is off: matrix products as precise as torch's, and
convolutions more precise (and slower) than torch's TF32 ones. Measured on an H100 (issue 28):
onnxruntime's default TF32 moved a ResNet-18 step's deep weight gradients by up to 0.44
relative from the CPU step's, 3.3e-2 without.

Core never imports torch: its flags are read only where the process imported it already.
The setting is read when a session is made (the first step of a fit, a module's first forward
at a new shape): set it before training.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

#: the user's choice (:func:`set_tf32`); None: follow torch
_SETTING: bool | None = None

#: torch's defaults: matrix products without TF32, cuDNN convolutions with it
TORCH_MATMUL_DEFAULT = False
TORCH_CUDNN_DEFAULT = True


def set_tf32(enabled: bool | None) -> None:
    """Chooses whether CUDA sessions use TF32 for float32 matrix products and convolutions.

    Parameters
    ----------
    enabled : bool or None
        True: TF32 (faster on Ampere and later GPUs, about 3 significant digits in a product's
        operands); False: full float32; None (the default): follow torch, TF32 only where both
        ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` are
        True in this process (off with torch's defaults, and where torch is not imported).

    Raises
    ------
    TypeError
        When ``enabled`` is not a bool or None.

    Notes
    -----
    The setting becomes the CUDA provider option ``use_tf32`` of each session made after the
    call (sessions made before keep theirs); it changes nothing on CPU.
    """
    global _SETTING
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(
            f"set_tf32 takes True (TF32 on CUDA), False (full float32) or None (follow torch's "
            f"torch.backends flags), got {enabled!r}"
        )
    _SETTING = enabled


def torch_tf32(modules: Mapping[str, Any] | None = None) -> bool:
    """Whether torch, as set in this process, uses TF32 for both matrix products and cuDNN
    convolutions (torch's defaults when torch is not imported: False).

    Parameters
    ----------
    modules : mapping, optional
        Where to look for an imported torch (``sys.modules`` when None).

    Returns
    -------
    bool
        ``torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32``.
    """
    torch = (sys.modules if modules is None else modules).get("torch")
    backends = getattr(torch, "backends", None)
    matmul = getattr(getattr(getattr(backends, "cuda", None), "matmul", None), "allow_tf32", None)
    cudnn = getattr(getattr(backends, "cudnn", None), "allow_tf32", None)
    matmul = TORCH_MATMUL_DEFAULT if matmul is None else bool(matmul)
    cudnn = TORCH_CUDNN_DEFAULT if cudnn is None else bool(cudnn)
    return matmul and cudnn


def tf32_enabled() -> bool:
    """Whether the CUDA sessions made now use TF32: :func:`set_tf32`'s choice, else torch's
    (:func:`torch_tf32`).

    Returns
    -------
    bool
        The value of the CUDA provider option ``use_tf32``.
    """
    return torch_tf32() if _SETTING is None else _SETTING


def cuda_provider_options(index: int) -> dict[str, str]:
    """The options of onnxruntime's CUDA provider for a session on GPU ``index``.

    Parameters
    ----------
    index : int
        The GPU.

    Returns
    -------
    dict of str to str
        ``device_id`` and ``use_tf32`` (``'1'`` or ``'0'``, :func:`tf32_enabled`).
    """
    return {"device_id": str(index), "use_tf32": "1" if tf32_enabled() else "0"}
