-- tests/lua/fake_cuda_oom.lua: out of device memory from Lua, on the pretend CUDA device of
-- tests/c/fake_cuda_backend.c limited to $FAKE_CUDA_CAPACITY bytes (ctest: lua/fake-cuda-oom).
-- Garbage the collector has not reached yet holds the device: the failed allocation collects it,
-- empties the cache and succeeds on its retry; a request larger than the device fails once more
-- and raises an error naming the request and the memory in use and cached; the process goes on.
local kiln = kiln or require "kiln"
local ffi = require "ffi"
assert(kiln.cuda.is_available(), "the fake CUDA device did not load: " .. tostring(kiln.cuda.unavailable_reason()))
local capacity = assert(tonumber(os.getenv("FAKE_CUDA_CAPACITY")), "FAKE_CUDA_CAPACITY must be set")
ffi.cdef [[
struct fake_cuda_counters {
  int64_t device_allocs, device_frees, copies_to_host, copies_from_host, async_copies_from_host, async_copies_untracked;
  int64_t host_allocs, host_frees, bad_host_frees, raw_host_allocs, events_recorded, synchronizes, empty_caches;
  int64_t device_ooms;
};
struct fake_cuda_counters *fake_cuda_counters(void);
]]
local counters = ffi.load(os.getenv("KILN_CUDA_LIB")).fake_cuda_counters()
local failed = 0
local function check(ok, what) if not ok then failed = failed + 1 print("FAILED: " .. what) end end

collectgarbage("stop")   -- the test decides when garbage is collected
local quarter = capacity / 4 / 4   -- f32 elements in a quarter of the device
local host = kiln.ones(quarter)
for _ = 1, 3 do local _ = host:cuda() end   -- three quarters held by garbage
local ooms, empties = tonumber(counters.device_ooms), tonumber(counters.empty_caches)
local ok, g = pcall(function() return kiln.ones(2 * quarter):cuda() end)   -- half: only after a collection
check(ok, "the retry after collecting garbage succeeds: " .. tostring(g))
check(tonumber(counters.device_ooms) == ooms + 1 and tonumber(counters.empty_caches) == empties + 1,
      "one refusal, one empty_cache, then the retry")
g = nil for _ = 1, 2 do local _ = kiln.ones(quarter):cuda() end   -- garbage again
ok = pcall(function() return kiln.empty(2 * quarter, {device = "cuda"}) end)   -- creation on the device: the same path
check(ok, "kiln.empty on the device after a collection")
local err
ok, err = pcall(function() return kiln.ones(capacity):cuda() end)   -- 4x the device
check(not ok, "more than the device has fails")
err = tostring(err)
check(err:find("out of memory", 1, true) and err:find(tostring(capacity * 4) .. " bytes", 1, true), "names the request: " .. err)
check(err:find("after collecting garbage and emptying the cache", 1, true) and err:find("in use", 1, true)
      and err:find("cached on cuda:0", 1, true), "names the memory in use and cached: " .. err)
check(err:find("fake_cuda_oom.lua", 1, true), "raised at the caller's line: " .. err)
print("fake_cuda_oom.lua: " .. err)
check(kiln.ones(3):cuda():cpu():sum():item() == 3, "the process goes on")
collectgarbage("restart")
print(string.format("fake_cuda_oom.lua: %d failed", failed))
os.exit(failed == 0 and 0 or 1)
