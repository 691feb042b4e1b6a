# tests/gpu/torch_gemm.py: PyTorch's GEMM on the same shapes and rows as bench_gemm.lua, for the
# ratio: f32 "highest" (TF32 off, as kiln's default), f32 "high" (TF32 on, as kiln's
# set_float32_matmul_precision("high")), bf16. One JSON line per result; run.sh runs it when
# PyTorch can be imported.
import json, os, sys, time
import torch
from torch_common import set_tf32

sizes = [int(s) for s in sys.argv[1:]] or [4096, 8192]
out_dir = os.environ.get("OUT")
rows = (("f32", "highest", torch.float32, 50e12), ("f32", "high", torch.float32, 300e12),
        ("bf16", "bf16", torch.bfloat16, 700e12))
for name, precision, dtype, rate in rows:
    set_tf32(matmul=precision == "high")
    for n in sizes:
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        for _ in range(3):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        flops = 2 * n ** 3
        iters = max(3, min(100, int(0.5 / (flops / rate))))
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters
        line = json.dumps({"bench": "gemm", "impl": "torch " + torch.__version__, "dtype": name, "precision": precision,
                           "n": n, "iters": iters, "ms": round(dt * 1e3, 3), "tflops": round(flops / dt / 1e12, 1)})
        print(line)
        if out_dir:
            with open(os.path.join(out_dir, "bench_gemm.jsonl"), "a") as f:
                f.write(line + "\n")
set_tf32(False)
