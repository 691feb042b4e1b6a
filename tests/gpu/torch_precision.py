# tests/gpu/torch_precision.py: TF32 on or off for PyTorch's matmul and cuDNN convolutions, for the
# peer scripts (torch_gemm.py, torch_conv.py, torch_rnn.py, torch_train.py). PyTorch 2.9 and later
# set it through fp32_precision ("ieee" / "tf32"), deprecate allow_tf32 and refuse a mix of the
# two; older versions only have allow_tf32.
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
