-- bench/ops.lua: the runtime's per-op overhead from Lua and its GEMM throughput beside a direct
-- cblas_sgemm call in the same run. One JSON line per result; medians of repeated runs.
-- usage: kiln bench/ops.lua [--quick]
local kiln = kiln or require "kiln"
local ffi = require "ffi"

local quick = false
for _, a in ipairs(arg or {}) do if a == "--quick" then quick = true end end

pcall(ffi.cdef, [[
  typedef struct { long tv_sec; long tv_nsec; } kiln_bench_timespec;
  int clock_gettime(int clk, kiln_bench_timespec *ts);
  void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc);
  void openblas_set_num_threads(int n);
]])
local ts = ffi.new("kiln_bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)     -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local blas = ffi.load("libopenblas.so.0")

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

local function json(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) if a == "bench" then return true elseif b == "bench" then return false end return a < b end)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = t[k]
    local s = type(v) == "string" and string.format("%q", v) or (math.floor(v) == v and string.format("%d", v) or string.format("%.4g", v))
    parts[#parts + 1] = string.format("%q:%s", k, s)
  end
  io.write("{", table.concat(parts, ","), "}\n")
  io.flush()
end

-- ---- per-op overhead: c = a + b on 16 f32 elements ----
do
  local a, b = kiln.randn(16), kiln.randn(16)
  local n, reps = quick and 20000 or 200000, quick and 3 or 9
  for threads = 1, 2 do
    kiln.set_num_threads(threads)
    local times = {}
    for r = 1, reps + 1 do
      collectgarbage()
      local t0 = now()
      for i = 1, n do local c = a + b end
      local dt = now() - t0
      if r > 1 then times[#times + 1] = dt / n * 1e6 end   -- the first run warms up the JIT
    end
    json{bench = "add16_overhead", threads = threads, us_per_op = median(times), reps = reps, ops_per_rep = n}
  end
end

-- ---- f32 GEMM: kiln's matmul (its pool; kiln's own kernel at the avx512 level, else OpenBLAS
-- single-threaded inside) vs direct cblas_sgemm ----
local sizes = quick and {256, 512} or {256, 512, 1024, 2048}
for _, threads in ipairs({1, 2}) do
  for _, n in ipairs(sizes) do
    local a, b = kiln.randn(n, n), kiln.randn(n, n)
    local c = kiln.empty(n, n)
    local flops = 2 * n * n * n
    local iters = math.max(1, math.floor(0.25e9 * threads / flops * 40))   -- about 0.2 s a measurement
    if quick then iters = math.max(1, math.floor(iters / 4)) end
    local reps = quick and 3 or 5
    local function measure(fn)
      fn()
      local rates = {}
      for r = 1, reps do
        local t0 = now()
        for i = 1, iters do fn() end
        rates[#rates + 1] = flops * iters / (now() - t0) * 1e-9
      end
      return median(rates)
    end
    local pa, pb, pc = ffi.cast("float *", a.p.storage.data), ffi.cast("float *", b.p.storage.data), ffi.cast("float *", c.p.storage.data)
    kiln.set_num_threads(threads)
    -- kiln's GEMM into an existing tensor (as the direct call writes into c), and the allocating
    -- call, whose fresh output memory is also part of what a user pays.
    local ours = measure(function() a:matmul(b, {out = c}) end)
    local alloc = measure(function() local r = a:matmul(b) end)
    -- Direct OpenBLAS with its own threads; then back to one thread, and a pause while its idle
    -- workers stop spinning, so that they do not compete with the next measurement.
    blas.openblas_set_num_threads(threads)
    local direct = measure(function() blas.cblas_sgemm(101, 111, 111, n, n, n, 1, pa, n, pb, n, 0, pc, n) end)
    blas.openblas_set_num_threads(1)
    os.execute("sleep 0.5")
    json{bench = "sgemm", n = n, threads = threads, kiln_gflops = ours, kiln_alloc_gflops = alloc, openblas_gflops = direct,
         ratio = ours / direct, alloc_ratio = alloc / direct, iters = iters, reps = reps}
  end
end
