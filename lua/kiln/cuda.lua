-- kiln.cuda: CUDA devices. libkiln loads its CUDA backend (libkiln_cuda.so) on the first use of
-- a device; on a machine without a GPU every function here still works and says so:
-- is_available() is false, unavailable_reason() tells why, and t:cuda() raises "no CUDA device: ...".
-- Devices are named "cuda", "cuda:0", "cuda:1", ... and numbered from 0 as in their names.
local core = require "kiln.core"
local ffi, C = core.ffi, core.C
local check = core.check

local M = {}

function M.is_available() return C.kiln_cuda_is_available() ~= 0 end
function M.device_count() return C.kiln_cuda_device_count() end

-- Why no device is usable ("no CUDA device: ..."), or nil when one is.
function M.unavailable_reason()
  local r = C.kiln_cuda_unavailable_reason()
  if r == nil then return nil end
  return ffi.string(r)
end

-- Load the backend now; raises "no CUDA device: ..." when none is usable.
function M.init() check(C.kiln_cuda_init()) end

-- Wait for the work queued on a device (default: every device); raises without one.
function M.synchronize(device)
  if type(device) == "string" then device = tonumber(device:match("^cuda:(%d+)$")) or 0 end
  check(C.kiln_cuda_synchronize(device or -1))
end

local fields = {"allocated", "reserved", "peak_allocated", "peak_reserved", "requests", "cache_hits", "device_allocs",
                "device_frees", "oom_retries", "pinned_allocated", "pinned_reserved"}

-- The caching allocator's statistics of a device (default 0), in bytes and counts; zeros without a GPU.
-- pinned_allocated and pinned_reserved count the page-locked host memory all devices share.
function M.memory_stats(device)
  if type(device) == "string" then device = tonumber(device:match("^cuda:(%d+)$")) or 0 end
  local s = ffi.new("struct kiln_cuda_memory")
  check(C.kiln_cuda_memory_stats(device or 0, s))
  local t = {}
  for _, f in ipairs(fields) do t[f] = tonumber(s[f]) end
  return t
end

-- Collect unreachable tensors, then give the allocator's unused blocks back to the driver.
function M.empty_cache()
  core.collect()
  check(C.kiln_cuda_empty_cache())
end

-- Devices draw from the one generator of kiln.manual_seed (the same numbers as on the CPU).
function M.manual_seed(seed) C.kiln_manual_seed(seed) end
M.manual_seed_all = M.manual_seed

-- Whether the CUDA backend has a kernel for an op (by name or number), with or without a device.
function M.has_kernel(op)
  if type(op) == "string" then
    for i = 0, C.KILN_OP_COUNT - 1 do
      if ffi.string(C.kiln_op_name(i)) == op then op = i break end
    end
    if type(op) == "string" then error(string.format("kiln.cuda.has_kernel: unknown op %q", op), 2) end
  end
  return C.kiln_cuda_op_supported(op) ~= 0
end

-- Whether the CUDA backend was built with cuDNN 9 (convolutions, the "cudnn" recurrent algorithm).
function M.has_cudnn() return C.kiln_cuda_has_cudnn() ~= 0 end

-- Whether libkiln_cuda.so was found and opened (it may still have found no device).
function M.backend_loaded() return C.kiln_cuda_backend_loaded() ~= 0 end

-- cuDNN's convolution settings. The CUDA backend reads them from the environment at every
-- convolution (KILN_CUDNN_API, KILN_CUDNN_BENCHMARK), so these setters take effect at the next one.
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
local function setenv(name, value)
  if ffi.C.setenv(name, value, 1) ~= 0 then error(string.format("kiln.cuda: setenv(%s) failed", name), 3) end
end

-- Which cuDNN API runs the convolutions: "graph" (the backend API, the default; a shape it cannot
-- plan goes to the legacy API) or "legacy" (cudnnConvolutionForward and its backward calls).
function M.set_conv_api(api)
  if api ~= "graph" and api ~= "legacy" then
    error(string.format("kiln.cuda.set_conv_api: expected \"graph\" or \"legacy\", got %s",
                        type(api) == "string" and string.format("%q", api) or tostring(api)), 2)
  end
  setenv("KILN_CUDNN_API", api)
end
function M.conv_api()
  local v = os.getenv("KILN_CUDNN_API")
  if v == nil or v == "" then return "graph" end
  return v
end

-- Benchmark mode: a convolution shape seen for the first time times cuDNN's candidates and keeps
-- the fastest (instead of taking the heuristics' first). The choice is cached per shape and mode.
function M.set_cudnn_benchmark(on)
  if type(on) ~= "boolean" then
    error("kiln.cuda.set_cudnn_benchmark: expected true or false, got " .. tostring(on), 2)
  end
  setenv("KILN_CUDNN_BENCHMARK", on and "1" or "0")
end
function M.cudnn_benchmark()
  local v = os.getenv("KILN_CUDNN_BENCHMARK")
  return v ~= nil and v ~= "" and v ~= "0"
end

-- ---- streams and events ----
-- Each device has a default stream and a current stream: every kernel, copy, cuBLAS and cuDNN call
-- on the device goes to the current one, and the caching allocator keeps its free blocks per
-- stream. kiln.cuda.stream(s, fn) runs fn with s current (as PyTorch's `with torch.cuda.stream(s)`);
-- work on two streams may overlap, and ordering them is the program's job: s:wait_stream(other),
-- s:wait_event(e), and t:record_stream(s) for a tensor made on one stream and used on another.
-- The current stream belongs to the process (kiln's Lua runs on one thread).

local function device_of(d, fname)
  if d == nil or d == "cuda" then return 0 end
  if type(d) == "number" and d >= 0 and d == math.floor(d) then return d end
  local n = type(d) == "string" and tonumber(d:match("^cuda:(%d+)$"))
  if n then return n end
  error(string.format("%s: expected a CUDA device (\"cuda\", \"cuda:N\" or N), got %s", fname, tostring(d)), 3)
end

local Stream = {}
Stream.__index = Stream
local Event = {}
Event.__index = Event

local defaults = {}   -- device -> its default stream object
local current = {}    -- device -> the current stream object (kept alive while current)

local function default_stream(dev)
  defaults[dev] = defaults[dev] or setmetatable({handle = nil, device = dev}, Stream)
  return defaults[dev]
end

-- A new stream on a device (default cuda:0). Freed when collected, after its work has finished.
function M.Stream(device)
  local dev = device_of(device, "kiln.cuda.Stream")
  local out = ffi.new("void *[1]")
  check(C.kiln_cuda_stream_new(dev, out))
  local handle = ffi.gc(out[0], function(h) C.kiln_cuda_stream_free(dev, h) end)
  return setmetatable({handle = handle, device = dev}, Stream)
end

function M.default_stream(device) return default_stream(device_of(device, "kiln.cuda.default_stream")) end

function M.current_stream(device)
  local dev = device_of(device, "kiln.cuda.current_stream")
  return current[dev] or default_stream(dev)
end

local function is_stream(s) return getmetatable(s) == Stream end
local function pack(...) return {n = select("#", ...), ...} end

-- Make s its device's current stream (nil: the default stream of cuda:0).
function M.set_stream(s)
  if s == nil then s = default_stream(0) end
  if not is_stream(s) then error("kiln.cuda.set_stream: expected a kiln.cuda.Stream, got " .. type(s), 2) end
  check(C.kiln_cuda_set_stream(s.device, s.handle))
  current[s.device] = s.handle ~= nil and s or nil
end

-- Run fn(...) with s current on its device, then make the previous stream current again (also when
-- fn raises); returns what fn returns.
function M.stream(s, fn, ...)
  if not is_stream(s) then error("kiln.cuda.stream: expected a kiln.cuda.Stream, got " .. type(s), 2) end
  if type(fn) ~= "function" then error("kiln.cuda.stream: expected a function to run, got " .. type(fn), 2) end
  local before = M.current_stream(s.device)
  M.set_stream(s)
  local r = pack(pcall(fn, ...))
  M.set_stream(before)
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, r.n)
end

function Stream:synchronize() check(C.kiln_cuda_stream_synchronize(self.device, self.handle)) end
-- Whether all the work queued on the stream has finished.
function Stream:query()
  local done = ffi.new("int[1]")
  check(C.kiln_cuda_stream_query(self.device, self.handle, done))
  return done[0] ~= 0
end
-- Work queued on this stream from now on waits for the work e marks.
function Stream:wait_event(e)
  if getmetatable(e) ~= Event then error("Stream:wait_event: expected a kiln.cuda.Event, got " .. type(e), 2) end
  check(C.kiln_cuda_stream_wait_event(self.device, self.handle, e.handle))
end
-- Work queued on this stream from now on waits for the work queued on other so far.
function Stream:wait_stream(other)
  if not is_stream(other) then error("Stream:wait_stream: expected a kiln.cuda.Stream, got " .. type(other), 2) end
  self:wait_event(other:record_event())
end
-- An event recorded on this stream now (e, or a new one).
function Stream:record_event(e)
  e = e or M.Event{device = self.device}
  e:record(self)
  return e
end
function Stream:__tostring()
  return string.format("kiln.cuda.Stream(cuda:%d, %s)", self.device, self.handle == nil and "default" or tostring(self.handle))
end
Stream.__eq = function(a, b) return a.device == b.device and a.handle == b.handle end

-- An event: a mark in a stream's work. opts: enable_timing (false), device (cuda:0).
function M.Event(opts)
  opts = core.options(opts, core.set("enable_timing", "device"), "kiln.cuda.Event")
  local dev = device_of(opts.device, "kiln.cuda.Event")
  local out = ffi.new("void *[1]")
  check(C.kiln_cuda_event_new(dev, opts.enable_timing and 1 or 0, out))
  local handle = ffi.gc(out[0], function(h) C.kiln_cuda_event_free(dev, h) end)
  return setmetatable({handle = handle, device = dev, timing = opts.enable_timing == true}, Event)
end

-- Mark the work queued so far on stream (default: the device's current stream).
function Event:record(stream)
  stream = stream or M.current_stream(self.device)
  if not is_stream(stream) then error("Event:record: expected a kiln.cuda.Stream, got " .. type(stream), 2) end
  if stream.device ~= self.device then
    error(string.format("Event:record: the event is on cuda:%d, the stream on cuda:%d", self.device, stream.device), 2)
  end
  check(C.kiln_cuda_event_record(self.device, self.handle, stream.handle))
  self.recorded = true
end
function Event:synchronize() check(C.kiln_cuda_event_synchronize(self.device, self.handle)) end
function Event:query()
  local done = ffi.new("int[1]")
  check(C.kiln_cuda_event_query(self.device, self.handle, done))
  return done[0] ~= 0
end
-- Make stream (default: the current one) wait for this event's work.
function Event:wait(stream) (stream or M.current_stream(self.device)):wait_event(self) end
-- Milliseconds from this event to end (both recorded, made with enable_timing, end complete).
function Event:elapsed_time(end_event)
  if getmetatable(end_event) ~= Event then error("Event:elapsed_time: expected a kiln.cuda.Event, got " .. type(end_event), 2) end
  if not (self.timing and end_event.timing) then
    error("Event:elapsed_time: both events must be made with {enable_timing = true}", 2)
  end
  if not (self.recorded and end_event.recorded) then error("Event:elapsed_time: both events must be recorded first", 2) end
  local ms = ffi.new("float[1]")
  check(C.kiln_cuda_event_elapsed_time(self.device, self.handle, end_event.handle, ms))
  return tonumber(ms[0])
end
function Event:__tostring() return string.format("kiln.cuda.Event(cuda:%d)", self.device) end

-- t's memory is also used by work queued on stream s: when t's storage goes, its block is not
-- handed out again until that work has finished (Tensor:record_stream calls this).
function M.record_stream(t, s)
  if not is_stream(s) then error("record_stream: expected a kiln.cuda.Stream, got " .. type(s), 3) end
  check(C.kiln_tensor_record_stream(t.p, s.handle))
end

return M
