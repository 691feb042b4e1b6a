"""PyTorch peer of bench/train_step.lua: the same models, batch sizes and thread counts.
usage: OMP_WAIT_POLICY=passive python3 bench/train_step.py [--amp bf16] [--model mlp|cnn] THREADS [--quick]
With --amp bf16 the forward runs under torch.autocast("cpu", dtype=torch.bfloat16).
Prints one JSON line per model: median step time (forward, backward, SGD momentum update)."""
import contextlib, json, statistics, sys, time
import torch
import torch.nn as nn

args = sys.argv[1:]
amp = None
if "--amp" in args:
    i = args.index("--amp")
    amp = args[i + 1]
    del args[i:i + 2]
only = None
if "--model" in args:
    i = args.index("--model")
    only = args[i + 1]
    del args[i:i + 2]
threads = int(args[0])
def autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16" else contextlib.nullcontext()
quick = "--quick" in sys.argv
torch.set_num_threads(threads)
torch.manual_seed(0)

def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))

def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))

for name, make, batch in (("mlp", mlp, 128), ("cnn", cnn, 64)):
    if only and name != only:
        continue
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    def step():
        opt.zero_grad()
        with autocast():
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    for _ in range(5):   # then a second untimed (a quarter with --quick), as bench/train_step.lua does
        step()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < (0.25 if quick else 1.0):
        step()
    steps = 10 if quick else 40
    reps = 3 if quick else 7
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - t0) / steps * 1000)
    print(json.dumps({"bench": "train_step", "impl": "pytorch", "version": torch.__version__, "model": name,
                      "batch": batch, "threads": threads, "amp": amp, "ms_per_step": statistics.median(times),
                      "best_ms": min(times), "reps": reps,
                      "steps_per_rep": steps}), flush=True)
