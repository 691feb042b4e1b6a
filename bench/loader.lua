-- bench/loader.lua: images/s of the C data loader on PNG files: decode + augment (random crop with
-- padding, horizontal flip, normalise) + collate into batches, at 1 and 2 worker threads. Writes
-- the images (RGB, 10 class folders) into a temporary folder first and removes it at the end. One
-- JSON line per worker count, the median of 3 epochs.
-- usage: kiln bench/loader.lua [--images N (2000)] [--size S (64)] [--batch-size B (64)] [--workers 1,2]
local kiln = kiln or require "kiln"
local data, ui = kiln.data, kiln.ui
local T = data.transforms

local opt = {images = 2000, size = 64, batch_size = 64, workers = "1,2"}
local args = arg or {}
local i = 1
while i <= #args do
  local k, v = args[i]:match("^%-%-([%w%-]+)=?(.*)$")
  if not k then error("bench/loader: unexpected argument " .. args[i], 0) end
  if v == "" then i = i + 1 v = args[i] end
  k = k:gsub("%-", "_")
  if opt[k] == nil or v == nil then error("bench/loader: unknown option or missing value: --" .. k, 0) end
  opt[k] = tonumber(v) or v
  i = i + 1
end
local worker_counts = {}
for w in tostring(opt.workers):gmatch("%d+") do worker_counts[#worker_counts + 1] = tonumber(w) end

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

local p = assert(io.popen("mktemp -d /tmp/kiln-bench-loader-XXXXXX"))
local root = p:read("*l")
p:close()
assert(root and root:match("^/tmp/kiln%-bench%-loader%-"), "mktemp -d failed")

local function run()
  -- the files: smooth random-ish RGB images, so that PNG compresses them as it would photos' noise
  local s = opt.size
  local t0 = ui.clock()
  for c = 0, 9 do os.execute(string.format("mkdir -p '%s/class%d'", root, c)) end
  for n = 1, opt.images do
    local img = kiln.rand(3, s, s):mul(64):add(kiln.linspace(0, 160, s):view(1, 1, s)):add(n % 32):to("u8")
    data.write_png(string.format("%s/class%d/%05d.png", root, n % 10, n), img)
  end
  ui.log("bench/loader: wrote %d %dx%d RGB PNG files in %.1f s", opt.images, s, s, ui.clock() - t0)

  local augment = T.Compose{T.RandomCrop{s, padding = 4}, T.RandomHorizontalFlip(),
                            T.Normalize{mean = {0.5, 0.5, 0.5}, std = {0.25, 0.25, 0.25}}}
  local ds = data.ImageFolder(root, {channels = 3, transform = augment})
  for _, workers in ipairs(worker_counts) do
    local loader = data.DataLoader{dataset = ds, batch_size = opt.batch_size, shuffle = true, seed = 1, workers = workers}
    local rates, waits = {}, {}
    for epoch = 1, 3 do
      local start, wait0, count = ui.clock(), loader.wait_seconds, 0
      for x in loader:epoch(epoch) do count = count + x:size(1) end
      local seconds = ui.clock() - start
      assert(count == opt.images, "an epoch yielded " .. count .. " images")
      rates[#rates + 1] = count / seconds
      waits[#waits + 1] = (loader.wait_seconds - wait0) / seconds
    end
    loader:close()
    ui.json{bench = "loader", what = "png decode+random_crop+hflip+normalize+collate", workers = workers,
            images_per_s = median(rates), images = opt.images, size = opt.size, batch_size = opt.batch_size, runs = 3,
            wait_fraction = median(waits), cpus = kiln.get_num_threads()}
  end
end

local ok, e = pcall(run)
os.execute("rm -rf '" .. root .. "'")
if not ok then error(e, 0) end
