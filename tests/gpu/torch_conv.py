# tests/gpu/torch_conv.py: PyTorch's conv2d on the same shapes as bench_conv.lua, for the ratio
# (f32 with TF32 off, as kiln's default; cudnn.benchmark as KILN_CUDNN_BENCHMARK). One JSON line
# per result; run.sh runs it when PyTorch can be imported.
import json, os
import torch
from torch_common import exact_f32, timed
import torch.nn.functional as F

exact_f32()
torch.backends.cudnn.benchmark = os.environ.get("KILN_CUDNN_BENCHMARK") == "1"
mode = "benchmark" if torch.backends.cudnn.benchmark else "heuristic"
shapes = [
    ("resnet conv1", (32, 3, 224, 224), (64, 3, 7, 7), 2, 3),
    ("resnet 3x3 @56", (32, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ("resnet 3x3 @14", (32, 256, 14, 14), (256, 256, 3, 3), 1, 1),
    ("resnet 1x1 @28", (32, 512, 28, 28), (128, 512, 1, 1), 1, 0),
]
out_dir = os.environ.get("OUT")



for name, xs, ws, stride, padding in shapes:
    x = torch.randn(xs, device="cuda", requires_grad=True)
    w = torch.randn(ws, device="cuda", requires_grad=True)
    g = torch.randn_like(F.conv2d(x, w, None, stride, padding))
    with torch.no_grad():
        fwd = timed(20, lambda: F.conv2d(x, w, None, stride, padding))

    def both():
        x.grad, w.grad = None, None
        F.conv2d(x, w, None, stride, padding).backward(g)

    fb = timed(10, both)
    line = json.dumps({"bench": "conv2d", "impl": "torch " + torch.__version__, "mode": mode, "shape": name,
                       "fwd_ms": round(fwd * 1e3, 3), "fwd_bwd_ms": round(fb * 1e3, 3)})
    print(line)
    if out_dir:
        with open(os.path.join(out_dir, "bench_conv.jsonl"), "a") as f:
            f.write(line + "\n")
