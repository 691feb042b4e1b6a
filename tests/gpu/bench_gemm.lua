-- tests/gpu/bench_gemm.lua: GEMM throughput on cuda:0, n x n @ n x n into a preallocated output
-- (kiln_matmul_out: no allocation in the timed loop), one JSON line per result, also appended to
-- $OUT/bench_gemm.jsonl when OUT is set. Rows: f32 at kiln.set_float32_matmul_precision("highest")
-- (exact f32, the default), f32 at "high" (TF32 tensor cores), bf16 (f32 accumulation). Targets on
-- the H200 at 8192: f32 >= 50 TFLOP/s, bf16 >= 700 TFLOP/s. tests/gpu/torch_gemm.py runs the same rows.
--   build/bin/kiln tests/gpu/bench_gemm.lua [n ...]       (default 4096 8192)
local kiln = kiln or require "kiln"
local C = kiln.C
local core = require "kiln.core"

if not kiln.cuda.is_available() then
  print("skipped: no CUDA device (" .. tostring(kiln.cuda.unavailable_reason()) .. ")")
  os.exit(0)
end

local sizes = {}
for i = 1, #arg do sizes[#sizes + 1] = tonumber(arg[i]) end
if #sizes == 0 then sizes = {4096, 8192} end

local dir = os.getenv("OUT")
local jsonl = dir and dir ~= "" and io.open(dir .. "/bench_gemm.jsonl", "a") or nil

local rows = {
  {dtype = "f32", precision = "highest", rate = 50e12},
  {dtype = "f32", precision = "high", rate = 300e12},
  {dtype = "bf16", precision = "highest", rate = 700e12},
}
local saved = kiln.get_float32_matmul_precision()
for _, row in ipairs(rows) do
  kiln.set_float32_matmul_precision(row.precision)
  for _, n in ipairs(sizes) do
    local a = kiln.randn(n, n, {device = "cuda"}):to(row.dtype)
    local b = kiln.randn(n, n, {device = "cuda"}):to(row.dtype)
    local out = kiln.empty(n, n, {dtype = row.dtype, device = "cuda"})
    for _ = 1, 3 do core.check(C.kiln_matmul_out(out.p, a.p, b.p)) end   -- warm-up (cuBLASLt heuristic, clocks)
    kiln.cuda.synchronize()
    local flops = 2 * n ^ 3
    local iters = math.max(3, math.min(100, math.floor(0.5 / (flops / row.rate))))   -- about half a second
    local t0 = kiln.ui.clock()
    for _ = 1, iters do core.check(C.kiln_matmul_out(out.p, a.p, b.p)) end
    kiln.cuda.synchronize()
    local dt = (kiln.ui.clock() - t0) / iters
    local line = string.format(
      '{"bench":"gemm","impl":"kiln","dtype":"%s","precision":"%s","n":%d,"iters":%d,"ms":%.3f,"tflops":%.1f}',
      row.dtype, row.dtype == "f32" and row.precision or "bf16", n, iters, dt * 1e3, flops / dt / 1e12)
    print(line)
    if jsonl then jsonl:write(line, "\n") end
    a:free(); b:free(); out:free()
  end
end
kiln.set_float32_matmul_precision(saved)
if jsonl then jsonl:close() end
