"""PyTorch peer of bench/rnn.lua: the same LSTM shapes and char-LM step, at one thread count.
usage: OMP_WAIT_POLICY=passive python3 bench/rnn.py [--amp bf16] [--char-lm] THREADS [--quick]
With --amp bf16 only the char-LM step runs, under torch.autocast("cpu", dtype=torch.bfloat16);
with --char-lm only the char-LM step runs."""
import contextlib, json
import torch
import torch.nn as nn
import common
from common import threads, quick, amp

torch.set_num_threads(threads)

def measure(fn):
    return common.measure(fn) * 1000   # milliseconds

T, I = 64, 256
import sys
for H in ([] if amp or "--char-lm" in sys.argv else [256] if quick else [256, 512, 1024]):
    for B in ([1, 16] if quick else [1, 4, 16, 64]):
        torch.manual_seed(0)
        lstm = nn.LSTM(I, H)
        x = torch.randn(T, B, I)
        def step():
            lstm.zero_grad()
            out, _ = lstm(x)
            out.sum().backward()
        print(json.dumps({"bench": "lstm_step", "impl": "pytorch", "version": torch.__version__, "input": I, "hidden": H,
                          "batch": B, "seq": T, "threads": threads, "ms": measure(step)}), flush=True)

torch.manual_seed(0)
V, E, H, B = 96, 64, 256, 32
emb, lstm, head = nn.Embedding(V, E), nn.LSTM(E, H), nn.Linear(H, V)
params = list(emb.parameters()) + list(lstm.parameters()) + list(head.parameters())
opt = torch.optim.Adam(params, lr=2e-3)
x, y = torch.randint(0, V, (T, B)), torch.randint(0, V, (T * B,))
def step():
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16" else contextlib.nullcontext():
        out, _ = lstm(emb(x))
        loss = nn.functional.cross_entropy(head(out.reshape(T * B, H)), y)
    loss.backward()
    opt.step()
ms, best = common.measure_both(step)
print(json.dumps({"bench": "char_lm_step", "impl": "pytorch", "version": torch.__version__, "vocab": V, "embedding": E,
                  "hidden": H, "batch": B, "seq": T, "threads": threads, "amp": amp, "ms": ms * 1000, "best_ms": best * 1000}),
      flush=True)
