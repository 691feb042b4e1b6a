-- tests/gpu/streams_spec.lua: streams and events on cuda:0: kernels, cuBLAS and cuDNN on a side
-- stream give the default stream's results; wait_stream / wait_event order two streams (a
-- consumer on one stream reads what a producer on another wrote); record_stream keeps a freed
-- block from being handed out while another stream still reads it; timing events measure a
-- GEMM; two streams' independent work overlaps (reported, not asserted); errors (freeing the
-- current stream, a freed stream). Exits 1 when a check fails; without a GPU prints "skipped: no
-- CUDA device" and exits 0.
--   build/bin/kiln tests/gpu/streams_spec.lua           (tests/gpu/run.sh runs it)
local kiln = kiln or require "kiln"
local cuda = kiln.cuda
if not cuda.is_available() then
  print("skipped: no CUDA device (" .. tostring(cuda.unavailable_reason()) .. ")")
  os.exit(0)
end
local F = kiln.functional
local failed, checks = 0, 0
local function check(ok, what)
  checks = checks + 1
  print((ok and "pass  " or "FAIL  ") .. what)
  if not ok then failed = failed + 1 end
end
local function max_diff(a, b) return (a:cpu():to("f64") - b:cpu():to("f64")):abs():max():item() end
local function guarded(what, fn)
  local ok, err = pcall(fn)
  if not ok then check(false, what .. ": " .. tostring(err)) end
end

guarded("ops on a side stream", function()
  kiln.manual_seed(3)
  local a, b = kiln.randn(300, 200), kiln.randn(200, 100)
  local x, w = kiln.randn(4, 3, 20, 20), kiln.randn(8, 3, 3, 3)
  local ga, gb, gx, gw = a:cuda(), b:cuda(), x:cuda(), w:cuda()
  local mm0, conv0, ew0 = ga:matmul(gb), F.conv2d(gx, gw, nil, {padding = 1}), (ga * 2 + 1):exp()
  local s = cuda.Stream()
  local mm1, conv1, ew1 = cuda.stream(s, function()
    return ga:matmul(gb), F.conv2d(gx, gw, nil, {padding = 1}), (ga * 2 + 1):exp()
  end)
  s:synchronize()
  check(max_diff(mm0, mm1) == 0 and max_diff(conv0, conv1) == 0 and max_diff(ew0, ew1) == 0,
        "GEMM, conv2d and elementwise on a side stream equal the default stream's")
  check(max_diff(mm1, a:matmul(b)) < 1e-3, "the side stream's GEMM against the CPU")
  check(cuda.current_stream() == cuda.default_stream(), "the default stream is current after stream(s, fn)")
end)

guarded("ordering two streams", function()
  -- the producer writes a large tensor on s1 (many kernels); s2 waits for it and reads it
  local s1, s2 = cuda.Stream(), cuda.Stream()
  local n = 4096
  local src = kiln.randn(n, n):cuda()
  cuda.synchronize()
  local produced
  cuda.stream(s1, function()
    produced = src:clone()
    for _ = 1, 20 do produced:mul_(1.0001):add_(-0.0001) end   -- queued work that takes a while
  end)
  local e = s1:record_event()
  s2:wait_event(e)
  local consumed = cuda.stream(s2, function() return produced:sum() end)
  s2:synchronize()
  local want = produced:sum()   -- the default stream: e (all of s1's work) is done, s2 waited for it
  cuda.synchronize()
  check(math.abs(consumed:item() - want:item()) <= 1e-3 * math.abs(want:item()) + 1e-2,
        "s2 after wait_event reads what s1 wrote")
  local third = cuda.Stream()
  cuda.stream(s1, function() produced:mul_(2) end)   -- more work on s1, then a stream that waits for it
  third:wait_stream(s1)
  local again = cuda.stream(third, function() return produced:sum() end)
  third:synchronize()
  local twice = 2 * consumed:item()
  check(math.abs(again:item() - twice) <= 1e-6 * math.abs(twice) + 1e-6, "a stream after wait_stream reads s1's latest work")
  cuda.synchronize()
  check(s1:query() and s2:query() and e:query(), "query: everything finished after synchronize")
end)

guarded("record_stream", function()
  -- t is made on the default stream and read on s by a long chain; t is freed at once; a new
  -- tensor of the same size made on the default stream and overwritten must not land in t's block
  -- while s still reads it
  local s = cuda.Stream()
  local n = 2048
  local t = kiln.full({n, n}, 1):cuda()
  local ref = kiln.full({n, n}, 1)
  cuda.synchronize()
  local out = cuda.stream(s, function()   -- long enough to still run while the host goes on
    local acc = t:clone()
    for _ = 1, 300 do acc:add_(t) end
    return acc
  end)
  t:record_stream(s)
  t:free()
  t = nil
  local other = kiln.empty(n, n):cuda()
  other:fill_(-1000)
  s:synchronize()
  local want = ref * 301
  check(max_diff(out, want) == 0, "a freed block another stream reads is not handed out before that stream is done")
  cuda.synchronize()
end)

guarded("timing events", function()
  local a = kiln.randn(2048, 2048):cuda()
  local start, stop = cuda.Event{enable_timing = true}, cuda.Event{enable_timing = true}
  start:record()
  for _ = 1, 10 do a:matmul(a) end
  stop:record()
  stop:synchronize()
  local ms = start:elapsed_time(stop)
  check(ms > 0 and ms < 10000, string.format("elapsed_time of 10 GEMMs 2048: %.3f ms", ms))
  -- overlap: the same independent work on one stream, then split over two
  local b = kiln.randn(2048, 2048):cuda()
  local function time(streams)
    cuda.synchronize()
    local t0, t1 = cuda.Event{enable_timing = true}, cuda.Event{enable_timing = true}
    t0:record()
    for i, s in ipairs(streams) do
      s:wait_event(t0)
      cuda.stream(s, function() for _ = 1, 10 do (i == 1 and a or b):matmul(i == 1 and a or b) end end)
    end
    for _, s in ipairs(streams) do cuda.default_stream():wait_stream(s) end
    t1:record()
    t1:synchronize()
    return t0:elapsed_time(t1)
  end
  local one = cuda.Stream()
  local t_one = time({one, one})
  local t_two = time({cuda.Stream(), cuda.Stream()})
  print(string.format("info  20 GEMMs 2048: one stream %.3f ms, two streams %.3f ms", t_one, t_two))
  check(t_two > 0 and t_one > 0, "two streams' work finishes")
end)

guarded("errors", function()
  local s = cuda.Stream()
  cuda.set_stream(s)
  local ok = kiln.C.kiln_cuda_stream_free(0, s.handle) == 0
  cuda.set_stream(nil)
  check(not ok, "the current stream is not freed")
  local ok2, err = pcall(function() cuda.Event():elapsed_time(cuda.Event()) end)
  check(not ok2 and tostring(err):match("enable_timing"), "elapsed_time without timing: an error")
  check((kiln.ones(3):cuda() + 1):sum():item() == 6, "the device works after the errors")
end)

print(string.format("streams_spec.lua: %d checks, %d failed", checks, failed))
os.exit(failed == 0 and 0 or 1)
