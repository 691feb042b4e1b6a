-- bench/common.lua: what the benchmarks share: their flags (--quick, --no-peer), a monotonic
-- clock, medians, and the median (and best) time of repeated calls.
local ffi = require "ffi"

local M = {quick = false, peer = true}
for _, a in ipairs(arg or {}) do
  if a == "--quick" then M.quick = true elseif a == "--no-peer" then M.peer = false end
end

pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } kiln_bench_ts; int clock_gettime(int, kiln_bench_ts *);")
local ts = ffi.new("kiln_bench_ts")
function M.now() ffi.C.clock_gettime(1, ts) return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9 end
function M.median(xs) table.sort(xs) local n = #xs return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2 end

-- Median seconds per call of fn, and the best rep's: after `warmup` calls (default 1) and a quarter of a second of
-- untimed calls, reps (3 quick, 5 otherwise) of enough calls to last about `target` seconds each
-- ({quick, full} seconds, default {0.05, 0.25}). The untimed calls bring the process to the state
-- a training loop runs in: an op on 4 MB tensors takes about a hundred calls (the heap growing
-- to hold what the collector has not freed yet) before its time settles.
function M.measure(fn, opts)
  opts = opts or {}
  for _ = 1, opts.warmup or 1 do fn() end
  local t0 = M.now()
  while M.now() - t0 < 0.25 do fn() end
  t0 = M.now()
  fn()
  local one = M.now() - t0
  local target = (opts.target or {0.05, 0.25})[M.quick and 1 or 2]
  local n = math.max(1, math.floor(target / math.max(one, 1e-7)))
  local times = {}
  for _ = 1, M.quick and 3 or 5 do
    t0 = M.now()
    for _ = 1, n do fn() end
    times[#times + 1] = (M.now() - t0) / n
  end
  return M.median(times), math.min(unpack(times))
end

-- The f32 multiply-add rate of a large square product (kiln.matmul at the current thread count:
-- kiln's own kernel at the avx512 level, OpenBLAS below it; kiln.info().blas.f32_gemm says which),
-- GFLOP/s: a model's GEMM FLOP at this rate is the time no algorithm beats by much (its floor).
function M.sgemm_gflops()
  local kiln = kiln or require "kiln"
  local n = 1024
  local a, b = kiln.randn(n, n), kiln.randn(n, n)
  return 2 * n ^ 3 / M.measure(function() kiln.matmul(a, b) end) / 1e9
end

-- The peer's python: KILN_PEER_PYTHON, else bench/.venv (PyTorch from PyPI, made by
-- bench/peer-venv.sh), else Debian's python3 (python3-torch 1.13).
local function peer_python()
  local env = os.getenv("KILN_PEER_PYTHON")
  if env and env ~= "" then return env end
  local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "bench/"
  local venv = here .. ".venv/bin/python"
  local f = io.open(venv)
  if f then f:close() return venv end
  return "/usr/bin/python3"
end
M.peer_python = peer_python()

-- With --no-peer unset and the peer's python holding torch: runs `script` (bench/NAME.py, PyTorch's
-- side) at each of `threads` (default 1 and 2), echoes its lines (unless quiet) and calls
-- on_line(line, threads) for each.
local has_torch
function M.peer_lines(script, on_line, threads, quiet)
  if not M.peer then return end
  if has_torch == nil then has_torch = os.execute(M.peer_python .. " -c 'import torch' 2>/dev/null") == 0 end
  if not has_torch then return end
  for _, t in ipairs(threads or {1, 2}) do
    local cmd = string.format("OMP_WAIT_POLICY=passive OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d %s %s %d%s", t, t,
                              M.peer_python, script, t, M.quick and " --quick" or "")
    local p = io.popen(cmd)
    for line in p:lines() do
      if not quiet then io.write(line, "\n") end
      on_line(line, t)
    end
    p:close()
  end
end

return M
