# tests/gpu/torch_common.py: what the PyTorch peer scripts (torch_gemm.py, torch_conv.py,
# torch_rnn.py, torch_train.py) share. TF32 on or off for matmul and cuDNN convolutions: PyTorch 2.9
# and later set it through fp32_precision ("ieee" / "tf32"), deprecate allow_tf32 and refuse a mix
# of the two; older versions only have allow_tf32. timed(): seconds per call on the GPU.
import time
import torch


def _has(obj, name):   # torch.backends.cuda.matmul raises AssertionError for an unknown name
    try:
        getattr(obj, name)
        return True
    except (AttributeError, AssertionError):
        return False


def set_tf32(matmul=False, conv=False):
    mm, cv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    if _has(mm, "fp32_precision") and cv is not None and _has(cv, "fp32_precision"):
        mm.fp32_precision = "tf32" if matmul else "ieee"
        cv.fp32_precision = "tf32" if conv else "ieee"
    else:
        mm.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = conv


def exact_f32():
    """TF32 off for matmul and cuDNN (kiln's default: exact f32)."""
    set_tf32(False, False)


def timed(iters, f):
    """Seconds per call of f: 3 calls of warm-up, then iters calls between synchronizations."""
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters
