# tests/gpu/torch_rnn.py: PyTorch's one-layer LSTM and GRU (cuDNN) on the same shapes as
# bench_rnn.lua, for the ratio: f32 with TF32 off, forward alone under no_grad and forward +
# backward (grads of x and the weights). One JSON line per result, also appended to
# $OUT/bench_rnn.jsonl when OUT is set.
import json, os
import torch
from torch_common import exact_f32, timed

exact_f32()
T, I = 64, 256
out_dir = os.environ.get("OUT")



for mode, cls in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU)):
    for H in (256, 1024):
        for B in (1, 16, 64):
            m = cls(I, H).cuda()
            x = torch.randn(T, B, I, device="cuda", requires_grad=True)
            g = torch.randn(T, B, H, device="cuda")
            with torch.no_grad():
                fwd = timed(10, lambda: m(x))

            def both():
                x.grad = None
                m.zero_grad(set_to_none=True)
                m(x)[0].backward(g)

            fb = timed(5, both)
            rec = {"bench": "rnn", "impl": "torch", "algorithm": "cudnn", "mode": mode, "T": T, "B": B, "I": I, "H": H,
                   "fwd_ms": round(fwd * 1e3, 3), "fwd_bwd_ms": round(fb * 1e3, 3), "torch": torch.__version__}
            line = json.dumps(rec)
            print(line)
            if out_dir:
                with open(os.path.join(out_dir, "bench_rnn.jsonl"), "a") as f:
                    f.write(line + "\n")
