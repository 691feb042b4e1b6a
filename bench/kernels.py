"""PyTorch peer of bench/kernels.lua: the same single ops, at one thread count.
usage: OMP_WAIT_POLICY=passive python3 bench/kernels.py THREADS [--quick]"""
import json
import torch
import torch.nn.functional as F
import common
from common import threads, quick

torch.set_num_threads(threads)
torch.manual_seed(0)

def measure(fn):
    return common.measure(fn, warmup=2, target=(0.03, 0.15)) * 1e6   # microseconds

a, b, row, acc = torch.randn(1024, 1024), torch.randn(1024, 1024), torch.randn(1024), torch.zeros(1024, 1024)
logits, target = torch.randn(256, 1000), torch.randint(0, 1000, (256,))
x, w = torch.randn(32, 32, 28, 28), torch.randn(64, 32, 3, 3)
bn_w, bn_b, rm, rv = torch.ones(32), torch.zeros(32), torch.zeros(32), torch.ones(32)
emb, idx = torch.randn(1024, 256), torch.randint(0, 1024, (4096,))
ops = [
    ("add", lambda: a + b),
    ("mul_broadcast_row", lambda: a * row),
    ("add_inplace", lambda: acc.add_(b)),
    ("exp", lambda: a.exp()),
    ("relu", lambda: a.relu()),
    ("sum_all", lambda: a.sum()),
    ("sum_last_dim", lambda: a.sum(1)),
    ("sum_first_dim", lambda: a.sum(0)),
    ("max_last_dim", lambda: a.max(1)),
    ("var_last_dim", lambda: a.var(1)),
    ("softmax", lambda: F.softmax(logits, 1)),
    ("log_softmax", lambda: F.log_softmax(logits, 1)),
    ("cross_entropy", lambda: F.cross_entropy(logits, target)),
    ("transpose_contiguous", lambda: a.t().contiguous()),
    ("cat", lambda: torch.cat([a, b], 0)),
    ("index_select_rows", lambda: emb.index_select(0, idx)),
    ("conv2d_3x3", lambda: F.conv2d(x, w, None, padding=1)),
    ("max_pool2d", lambda: F.max_pool2d(x, 2)),
    ("batch_norm_train", lambda: F.batch_norm(x, rm, rv, bn_w, bn_b, training=True)),
    ("layer_norm", lambda: F.layer_norm(logits, (1000,))),
]
if quick:
    ops = [ops[0], ops[5], ops[10], ops[13]]
with torch.no_grad():
    for name, fn in ops:
        print(json.dumps({"bench": "kernel", "impl": "pytorch", "version": torch.__version__, "op": name,
                          "threads": threads, "us": round(measure(fn), 3)}), flush=True)
