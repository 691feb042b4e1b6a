-- tests/gpu/pinned_spec.lua: pinned host memory and uploads that do not wait, on cuda:0: the
-- pin_memory round trip, non_blocking uploads (whole tensors and views with offsets) then
-- synchronize equal to the source, pinned blocks reused after their copies finished, and a
-- DataLoader with pin_memory and device = "cuda" giving the CPU loader's batches, in order.
-- Exits 1 when a check fails; without a GPU prints "skipped: no CUDA device" and exits 0.
--   build/bin/kiln tests/gpu/pinned_spec.lua           (tests/gpu/run.sh runs it)
local kiln = kiln or require "kiln"
local data = kiln.data
if not kiln.cuda.is_available() then
  print("skipped: no CUDA device (" .. tostring(kiln.cuda.unavailable_reason()) .. ")")
  os.exit(0)
end
local failed, checks = 0, 0
local function check(ok, what)
  checks = checks + 1
  print((ok and "pass  " or "FAIL  ") .. what)
  if not ok then failed = failed + 1 end
end
local function same(a, b)
  if table.concat(a:size(), ",") ~= table.concat(b:size(), ",") or a:dtype() ~= b:dtype() then return false end
  return (a:cpu():to("f64") - b:cpu():to("f64")):abs():max():item() == 0
end
local function guarded(what, fn)
  local ok, err = pcall(fn)
  if not ok then check(false, what .. ": " .. tostring(err)) end
end

guarded("pin_memory", function()
  local t = kiln.randn(257, 33)
  local p = t:pin_memory()
  check(p:is_pinned() and not t:is_pinned() and same(p, t), "pin_memory round trip")
  local g = p:cuda{non_blocking = true}
  kiln.cuda.synchronize()
  check(same(g, t), "non_blocking upload then synchronize")
  local row = p:narrow(1, 100, 50)   -- a view with an offset inside the pinned block
  check(same(row:cuda{non_blocking = true}, row), "non_blocking upload of a view")
  -- many uploads in flight, each source freed at once: the blocks come back only after their copies
  local srcs, outs = {}, {}
  for i = 1, 64 do srcs[i] = kiln.full({1024, 256}, i) end
  for i = 1, 64 do
    local pi = srcs[i]:pin_memory()
    outs[i] = pi:cuda{non_blocking = true}
    pi:free()
  end
  kiln.cuda.synchronize()
  local ok = true
  for i = 1, 64 do ok = ok and outs[i]:sum():item() == i * 1024 * 256 end
  check(ok, "64 uploads in flight with their pinned sources freed at once")
  local s = kiln.cuda.memory_stats()
  check(s.pinned_reserved > 0 and s.pinned_reserved < 64 * 1024 * 1024 * 4, string.format(
        "pinned blocks reused (%.1f MiB page-locked for 64 uploads of 1 MiB)", s.pinned_reserved / 2 ^ 20))
  -- a write into the host tensor after a blocking upload does not reach the device copy
  local p2 = kiln.ones(1000):pin_memory()
  local g2 = p2:cuda()
  p2:fill_(5)
  check(g2:sum():item() == 1000, "blocking upload from pinned memory waits")
end)

guarded("DataLoader", function()
  local n = 203
  local x, y = kiln.rand(n, 3, 16, 16), kiln.arange(0, n):to("i64")
  local ds = data.TensorDataset(x, y)
  local aug = data.transforms.Compose{data.transforms.RandomCrop{12, padding = 2}, data.transforms.RandomHorizontalFlip()}
  for _, workers in ipairs({0, 2, 4}) do
    local cpu = data.DataLoader{dataset = ds, batch_size = 16, shuffle = true, seed = 3, workers = workers, transform = aug}
    local dev = data.DataLoader{dataset = ds, batch_size = 16, shuffle = true, seed = 3, workers = workers, transform = aug,
                                pin_memory = true, device = "cuda"}
    local ok, batches = true, 0
    for epoch = 0, 1 do
      local it = dev:epoch(epoch)
      for xc, yc in cpu:epoch(epoch) do
        local xd, yd = it()
        batches = batches + 1
        ok = ok and xd:device() == "cuda:0" and same(xd, xc) and same(yd, yc)
      end
      ok = ok and it() == nil
    end
    check(ok and batches == 26, string.format("DataLoader pin_memory, device = cuda, %d workers: the cpu loader's batches", workers))
    cpu:close() dev:close()
  end
end)

print(string.format("pinned_spec.lua: %d checks, %d failed", checks, failed))
os.exit(failed == 0 and 0 or 1)
