"""What the PyTorch peers of the benchmarks share: the thread count, --quick and --amp bf16 from the
command line, and the median time of repeated calls (the same rule as bench/common.lua)."""
import statistics, sys, time

args = sys.argv[1:]
amp = args[args.index("--amp") + 1] if "--amp" in args else None   # "bf16": torch.autocast("cpu")
threads = int(next(a for i, a in enumerate(args) if a.isdigit() and (i == 0 or args[i - 1] != "--amp")))
quick = "--quick" in sys.argv

def measure(fn, warmup=1, target=(0.05, 0.25)):
    """Median seconds per call of fn (measure_both's first)."""
    return measure_both(fn, warmup, target)[0]

def measure_both(fn, warmup=1, target=(0.05, 0.25)):
    """Median seconds per call of fn: after `warmup` calls and a quarter of a second of untimed
    calls (the same rule as bench/common.lua), reps (3 quick, 5 otherwise) of enough calls to last
    about target[0] (quick) or target[1] seconds each; and the best rep's."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.25:
        fn()
    t0 = time.perf_counter(); fn(); one = time.perf_counter() - t0
    n = max(1, int(target[0 if quick else 1] / max(one, 1e-7)))
    times = []
    for _ in range(3 if quick else 5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times), min(times)
