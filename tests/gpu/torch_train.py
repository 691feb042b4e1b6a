# tests/gpu/torch_train.py: PyTorch's training step on the same models and sizes as bench_train.lua
# (the main job's CNN at batch 64 on 28x28; ResNet-18 at 224x224, batch 64, 1000 classes), for the
# ratio. f32 exact: TF32 off for matmul and cuDNN; cudnn.benchmark on (as KILN_CUDNN_BENCHMARK=1).
# The models are written out here (torchvision need not be installed); ResNet-18 is torchvision's
# resnet18, its state-dict names and parameter count (11,689,512) included. The same step and timing
# as bench_train.lua: forward, cross-entropy, zero_grad, backward, SGD (lr 0.01, momentum 0.9,
# Nesterov); warm-up steps, then the median of reps runs of n steps between synchronizations.
# One JSON line per model, then a ratio line (kiln_ms / pytorch_ms) per model that bench_train.lua
# timed (read from --kiln FILE, default $OUT/bench_train.jsonl); all appended to
# $OUT/bench_train.jsonl when OUT is set. run.sh runs it after bench_train.lua when torch imports.
#   python3 tests/gpu/torch_train.py [--device cuda|cpu] [--quick] [--models cnn,resnet18] [--kiln FILE]
import argparse
import json
import os
import statistics
import time

import torch
from torch_common import exact_f32
import torch.nn as nn

TARGET = 1.1   # the goal: kiln's training step within 1.1x of PyTorch's


def lenet(channels=1, classes=10):
    """models/lenet.lua."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Dropout(0),
        nn.Linear(1024, classes))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = x if self.downsample is None else self.downsample(x)
        return self.relu(y + s)


class ResNet18(nn.Module):
    """torchvision.models.resnet18, written out: models/resnet18.lua."""

    def __init__(self, channels=3, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = 64
        for i, w in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            setattr(self, "layer%d" % (i + 1), nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w, 1)))
            cin = w
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# the same table as bench_train.lua
CONFIGS = {
    "cnn": dict(make=lenet, batch=64, channels=1, image=28, classes=10, warmup=20, reps=7, steps=20,
                quick=dict(warmup=2, reps=3, steps=3)),
    "resnet18": dict(make=ResNet18, batch=64, channels=3, image=224, classes=1000, warmup=5, reps=5, steps=6,
                     quick=dict(batch=2, image=64, warmup=1, reps=3, steps=2)),
}


def bench(name, device, quick):
    c = CONFIGS[name]
    s = dict(c, **(c["quick"] if quick else {}))
    torch.manual_seed(0)
    model = c["make"](channels=c["channels"], classes=c["classes"]).to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    criterion = nn.CrossEntropyLoss()
    x = torch.randn(s["batch"], c["channels"], s["image"], s["image"], device=device)
    y = torch.randint(0, c["classes"], (s["batch"],), device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    loss = None

    def step():
        nonlocal loss
        loss = criterion(model(x), y)
        sgd.zero_grad()
        loss.backward()
        sgd.step()

    t0 = time.perf_counter()
    for _ in range(s["warmup"]):
        step()
    sync()
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(s["reps"]):
        sync()
        t = time.perf_counter()
        for _ in range(s["steps"]):
            step()
        sync()
        times.append((time.perf_counter() - t) / s["steps"] * 1e3)
    ms = statistics.median(times)
    return {"bench": "train_step", "impl": "torch " + torch.__version__, "device": device,
            "mode": "benchmark" if torch.backends.cudnn.benchmark else "heuristic", "model": name,
            "batch": s["batch"], "image": s["image"], "classes": c["classes"], "ms_per_step": round(ms, 4),
            "images_per_s": round(s["batch"] / ms * 1e3, 1), "min_ms": round(min(times), 4),
            "max_ms": round(max(times), 4), "reps": s["reps"], "steps_per_rep": s["steps"],
            "warmup_s": round(warmup_s, 3), "loss": loss.item(),
            "parameters": sum(p.numel() for p in model.parameters())}


def kiln_results(path):
    """bench_train.lua's lines in path, by (model, device, batch, image)."""
    found = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("bench") == "train_step" and r.get("impl") == "kiln" and "ms_per_step" in r:
                    found[(r["model"], r["device"], r["batch"], r["image"])] = r
    return found


def main():
    ap = argparse.ArgumentParser(description="PyTorch training steps beside bench_train.lua")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default="cnn,resnet18")
    ap.add_argument("--kiln", default=None, help="bench_train.lua's JSON lines (default $OUT/bench_train.jsonl)")
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device for PyTorch")
        return
    exact_f32()
    torch.backends.cudnn.benchmark = True
    out_dir = os.environ.get("OUT")
    out = os.path.join(out_dir, "bench_train.jsonl") if out_dir else None
    ours = kiln_results(a.kiln or out)
    lines, failed = [], False
    names = a.models.split(",")
    for name in names:
        if name not in CONFIGS:
            raise SystemExit("torch_train.py: unknown model %s (cnn, resnet18)" % name)
    for name in names:
        try:
            r = bench(name, a.device, a.quick)
        except Exception as e:   # out of memory, a cuDNN error: this model's line says so, the next one runs
            failed = True
            lines.append({"bench": "train_step", "impl": "torch " + torch.__version__, "device": a.device,
                          "model": name, "error": "%s: %s" % (type(e).__name__, e)})
            print(json.dumps(lines[-1]), flush=True)
            continue
        lines.append(r)
        k = ours.get((name, a.device, r["batch"], r["image"]))
        if k:
            ratio = k["ms_per_step"] / r["ms_per_step"]
            lines.append({"bench": "train_step_ratio", "model": name, "device": a.device, "batch": r["batch"],
                          "image": r["image"], "kiln_ms": round(k["ms_per_step"], 4), "pytorch_ms": r["ms_per_step"],
                          "ratio": round(ratio, 3), "target": TARGET, "within_target": ratio <= TARGET})
        for line in lines[-2 if k else -1:]:
            print(json.dumps(line), flush=True)
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if out:
        with open(out, "a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
