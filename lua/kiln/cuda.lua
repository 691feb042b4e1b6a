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

return M
