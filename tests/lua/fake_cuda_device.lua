-- tests/lua/fake_cuda_device.lua: the Lua side of pinned memory, of the DataLoader's uploads and
-- of streams and events, against the pretend CUDA device of tests/c/fake_cuda_backend.c (host memory, no kernels, the real
-- pinned cache, call counters). ctest runs it as lua/fake-cuda-device with $KILN_CUDA_LIB naming
-- fake_kiln_cuda_device; not a busted spec (the device must be there from the process's start).
--   KILN_CUDA_LIB=build/lib/libfake_kiln_cuda_device.so build/bin/kiln tests/lua/fake_cuda_device.lua
local kiln = kiln or require "kiln"
local ffi = require "ffi"
local data = kiln.data

local lib = assert(os.getenv("KILN_CUDA_LIB"), "KILN_CUDA_LIB must name the fake CUDA device")
assert(kiln.cuda.is_available(), "the fake CUDA device did not load: " .. tostring(kiln.cuda.unavailable_reason()))
ffi.cdef [[
struct fake_cuda_counters {
  int64_t device_allocs, device_frees, copies_to_host, copies_from_host, async_copies_from_host, async_copies_untracked;
  int64_t host_allocs, host_frees, bad_host_frees, raw_host_allocs, events_recorded, synchronizes, empty_caches;
  int64_t device_ooms, streams_made, streams_freed, stream_switches, stream_waits, records_on_streams;
  int64_t events_made, events_freed, events_on_streams;
};
struct fake_cuda_counters *fake_cuda_counters(void);
]]
local counters = ffi.load(lib).fake_cuda_counters()
local function count(f) return tonumber(counters[f]) end

local checks, failed = 0, 0
local function check(ok, what)
  checks = checks + 1
  if not ok then failed = failed + 1 print("FAILED: " .. what) end
end
local function same(a, b)
  if table.concat(a:size(), ",") ~= table.concat(b:size(), ",") or a:dtype() ~= b:dtype() then return false end
  local u, v = a:cpu():reshape(-1):totable(), b:cpu():reshape(-1):totable()
  for i = 1, #u do if u[i] ~= v[i] then return false end end
  return #u == #v
end

-- tensors
local t = kiln.randn(6, 5)
local p = t:pin_memory()
check(p:is_pinned() and not t:is_pinned() and p:device() == "cpu" and same(p, t), "pin_memory copies into pinned memory")
check(p:pin_memory().p == p.p, "pin_memory of a pinned tensor is the tensor")
check(t:t():pin_memory():is_contiguous() and same(t:t():pin_memory(), t:t()), "pin_memory of a view is contiguous")
local async = count("async_copies_from_host")
local g = p:cuda{non_blocking = true}
kiln.cuda.synchronize()
check(g:device() == "cuda:0" and same(g, t), "non_blocking upload round trip")
check(count("async_copies_from_host") == async + 1, "the upload from pinned memory did not wait")
local g2 = p:to("cuda", {non_blocking = true})
local g3 = t:to{device = "cuda", non_blocking = true}   -- pageable: waits
check(count("async_copies_from_host") == async + 2 and same(g2, t) and same(g3, t), "to(..., {non_blocking})")
check(kiln.cuda.memory_stats().pinned_reserved >= 4096, "memory_stats counts pinned memory")

-- the loader: the same batches as on the cpu, on the device, every batch collated into pinned memory
local n = 29
local x, y = kiln.rand(n, 2, 5, 4), kiln.arange(0, n):to("i64")
local ds = data.TensorDataset(x, y)
local aug = data.transforms.Compose{data.transforms.RandomHorizontalFlip(), data.transforms.Normalize{mean = {0.5}, std = {0.25}}}
for _, case in ipairs({{workers = 0}, {workers = 2, transform = aug}, {workers = 3, prefetch = 1}}) do
  local function make(extra)
    local o = {dataset = ds, batch_size = 6, shuffle = true, seed = 5, workers = case.workers, prefetch = case.prefetch,
               transform = case.transform}
    for k, v in pairs(extra) do o[k] = v end
    return data.DataLoader(o)
  end
  local cpu, dev = make{}, make{device = "cuda"}
  check(dev.pin_memory == true and dev.device == "cuda:0" and cpu.pin_memory == false, "pin_memory defaults on with a CUDA device")
  local allocs, uploads = count("host_allocs"), count("async_copies_from_host")
  local batches, ok = 0, true
  for epoch = 0, 1 do
    local it = dev:epoch(epoch)
    for xc, yc in cpu:epoch(epoch) do
      local xd, yd = it()
      batches = batches + 1
      ok = ok and xd:device() == "cuda:0" and yd:device() == "cuda:0" and same(xd, xc) and same(yd, yc)
    end
    check(it() == nil, "both loaders end together")
  end
  check(ok and batches == 10, string.format("workers %d: device batches equal the cpu loader's", case.workers))
  check(count("host_allocs") == allocs + 2 * batches, "every batch tensor collated into pinned memory")
  check(count("async_copies_from_host") == uploads + 2 * batches, "every batch uploaded without waiting")
  local pinned_cpu = make{pin_memory = true}
  for xb, yb in pinned_cpu:epoch(0) do check(xb:is_pinned() and yb:is_pinned() and xb:device() == "cpu", "pinned cpu batches") break end
  cpu:close() dev:close() pinned_cpu:close()
end
-- a Lua dataset (len and get), collated on this thread, pinned and uploaded the same way
local lua_ds = {len = function() return 7 end, get = function(_, i) return kiln.full({3}, i), i end}
local ref = {}
for xb in data.DataLoader{dataset = lua_ds, batch_size = 3}:epoch(0) do ref[#ref + 1] = xb end
local k = 0
for xb in data.DataLoader{dataset = lua_ds, batch_size = 3, device = "cuda"}:epoch(0) do
  k = k + 1
  check(xb:device() == "cuda:0" and same(xb, ref[k]), "a Lua dataset's batches on the device")
end
check(k == 3, "a Lua dataset's batch count")

-- streams and events: the current stream, switching and coming back (also when fn raises),
-- ordering calls reaching the backend, handles freed with their objects, errors
local cuda = kiln.cuda
local default = cuda.current_stream()
check(default == cuda.default_stream() and tostring(default):match("default"), "the default stream is current")
local s1, s2 = cuda.Stream(), cuda.Stream("cuda:0")
check(count("streams_made") == 2 and s1 ~= s2 and s1 ~= default, "two new streams")
local switches = count("stream_switches")
local r1, r2 = cuda.stream(s1, function(a, b)
  check(cuda.current_stream() == s1, "inside stream(s1, fn) s1 is current")
  cuda.stream(s2, function() check(cuda.current_stream() == s2, "nested: s2 current") end)
  check(cuda.current_stream() == s1, "back to s1 after the nested one")
  return a + b, "x"
end, 2, 3)
check(r1 == 5 and r2 == "x" and cuda.current_stream() == default, "stream(s, fn) returns fn's results, the default is current again")
check(count("stream_switches") == switches + 4, "four switches reached the backend")
local ok, err = pcall(cuda.stream, s1, function() error("inside") end)
check(not ok and tostring(err):match("inside") and cuda.current_stream() == default, "a raising fn: the previous stream current again")
ok, err = pcall(cuda.set_stream, "s1")
check(not ok and tostring(err):match("expected a kiln.cuda.Stream"), "set_stream of a string: an error")
cuda.set_stream(s2)
check(kiln.C.kiln_cuda_stream_free(0, s2.handle) ~= 0 and ffi.string(kiln.C.kiln_error_message()):match("current stream"),
      "the current stream is not freed")
cuda.set_stream(nil)
check(cuda.current_stream() == default, "set_stream(nil): the default stream")
local waits = count("stream_waits")
s1:wait_stream(s2)
local e = cuda.Event{enable_timing = true}
local e2 = s1:record_event(cuda.Event{enable_timing = true})
e:record()
check(count("stream_waits") == waits + 1 and count("events_on_streams") >= 3 and e:query() and s1:query(), "wait_stream, record, query")
e2:synchronize()
s2:synchronize()
check(e:elapsed_time(e2) == 0.25, "elapsed_time from the backend")
ok, err = pcall(function() cuda.Event():elapsed_time(e2) end)
check(not ok and tostring(err):match("enable_timing"), "elapsed_time without timing: an error")
ok, err = pcall(cuda.Event, {timing = true})
check(not ok and tostring(err):match("unknown option"), "Event with an unknown option: an error")
local dt = kiln.randn(4, 4):cuda()
dt:record_stream(s1)
check(count("records_on_streams") == 1, "record_stream reaches the backend")
ok, err = pcall(function() kiln.randn(2):record_stream(s1) end)
check(not ok and tostring(err):match("only cuda tensors"), "record_stream of a cpu tensor: an error")
ok, err = pcall(cuda.Stream, "cuda:3")
check(not ok and tostring(err):match("no CUDA device cuda:3"), "a stream on a missing device: an error")
s1, s2, e, e2 = nil, nil, nil, nil
collectgarbage() collectgarbage()
check(count("streams_freed") == 2 and count("events_freed") == count("events_made"), "streams and events freed with their objects")

collectgarbage() collectgarbage()
check(count("bad_host_frees") == 0 and count("async_copies_untracked") == 0, "pinned blocks freed and tracked")
print(string.format("fake_cuda_device.lua: %d checks, %d failed (%d pinned blocks asked, %d made)", checks, failed,
                    count("host_allocs"), count("raw_host_allocs")))
os.exit(failed == 0 and 0 or 1)
