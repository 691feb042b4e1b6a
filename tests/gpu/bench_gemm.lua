-- tests/gpu/bench_gemm.lua: GEMM throughput on cuda:0, n x n @ n x n into a preallocated output
-- (kiln_matmul_out: no allocation in the timed loop), one JSON line per result, also appended to
-- $OUT/bench_gemm.jsonl when OUT is set. f32 is exact f32 (no TF32); bf16 computes in f32.
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

for _, dtype in ipairs({"f32", "bf16"}) do
  for _, n in ipairs(sizes) do
    local a = kiln.randn(n, n, {device = "cuda"}):to(dtype)
    local b = kiln.randn(n, n, {device = "cuda"}):to(dtype)
    local out = kiln.empty(n, n, {dtype = dtype, device = "cuda"})
    for _ = 1, 3 do core.check(C.kiln_matmul_out(out.p, a.p, b.p)) end   -- warm-up (cuBLAS heuristics, clocks)
    kiln.cuda.synchronize()
    local flops = 2 * n ^ 3
    local iters = math.max(3, math.min(50, math.floor(0.5 / (flops / 50e12))))   -- about half a second at 50 TFLOP/s
    local t0 = kiln.ui.clock()
    for _ = 1, iters do core.check(C.kiln_matmul_out(out.p, a.p, b.p)) end
    kiln.cuda.synchronize()
    local dt = (kiln.ui.clock() - t0) / iters
    local line = string.format('{"bench":"gemm","impl":"kiln","dtype":"%s","n":%d,"iters":%d,"ms":%.3f,"tflops":%.1f}',
                               dtype, n, iters, dt * 1e3, flops / dt / 1e12)
    print(line)
    if jsonl then jsonl:write(line, "\n") end
    a:free(); b:free(); out:free()
  end
end
if jsonl then jsonl:close() end
