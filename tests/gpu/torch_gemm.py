# tests/gpu/torch_gemm.py: PyTorch's GEMM on the same shapes as bench_gemm.lua, for the ratio
# (f32 with TF32 off, as kiln's default; bf16). One JSON line per result; run.sh runs it when
# PyTorch can be imported.
import json, os, sys, time
import torch

torch.backends.cuda.matmul.allow_tf32 = False
sizes = [int(s) for s in sys.argv[1:]] or [4096, 8192]
out_dir = os.environ.get("OUT")
for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
    for n in sizes:
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        for _ in range(3):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        flops = 2 * n ** 3
        iters = max(3, min(50, int(0.5 / (flops / 50e12))))
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters
        line = json.dumps({"bench": "gemm", "impl": "torch " + torch.__version__, "dtype": name, "n": n,
                           "iters": iters, "ms": round(dt * 1e3, 3), "tflops": round(flops / dt / 1e12, 1)})
        print(line)
        if out_dir:
            with open(os.path.join(out_dir, "bench_gemm.jsonl"), "a") as f:
                f.write(line + "\n")
