-- The C data loader: every worker count gives bitwise-identical batches (tensors in memory and
-- image folders, with random transforms); the order is data.batches' order; drop_last, skips and
-- sampler hooks; transforms against naive Lua references; image folders (classes, labels, every
-- format); bad files each a clear error naming the file, without a hang; workers joined on close.
local kiln = kiln or require "kiln"
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "?.lua;" .. package.path
local H = require "helpers"
local ffi = require "ffi"
local bit = require "bit"
local data = kiln.data
local T = data.transforms
local C = require("kiln.core").C

local err = H.error_of

local function assert_contains(msg, ...)
  for _, part in ipairs({...}) do
    assert(H.contains(msg, part), string.format("message %q lacks %q", msg, part))
  end
end

-- The bytes of a tensor's elements (bitwise comparisons).
local function bytes_of(t)
  t = t:contiguous()
  local es = t:element_size()
  return ffi.string(ffi.cast("char *", t.p.storage.data) + t.p.offset * es, t:numel() * es)
end

-- Every batch of an epoch, as byte strings per tensor.
local function epoch_bytes(loader, e)
  local out = {}
  for x, y in loader:epoch(e) do out[#out + 1] = {bytes_of(x), y and bytes_of(y) or ""} end
  return out
end

-- The loader's worker threads alive in this process (named kiln-loader-N; a sanitizer's or a
-- library's own threads do not count).
local function threads()
  local lfs = require "lfs"
  if not lfs.attributes("/proc/self/task") then return nil end
  local n = 0
  for tid in lfs.dir("/proc/self/task") do
    local f = tid:match("^%d+$") and io.open("/proc/self/task/" .. tid .. "/comm")
    if f then
      if f:read("*l"):match("^kiln%-loader%-") then n = n + 1 end
      f:close()
    end
  end
  return n
end

-- threads() once it equals want, or after 2 s whatever it is: a joined thread's /proc entry can
-- outlive pthread_join by a moment (the kernel clears its tid before it releases the task).
local function threads_settled(want)
  local n = threads()
  for _ = 1, 200 do
    if n == want then return n end
    os.execute("sleep 0.01")
    n = threads()
  end
  return n
end

-- ---- files ----

local dir
local function path_of(name) return dir .. "/" .. name end
local function write(name, bytes)
  local f = assert(io.open(path_of(name), "wb"))
  f:write(bytes)
  f:close()
  return path_of(name)
end
local function mkdir(name) os.execute("mkdir -p '" .. path_of(name) .. "'") return path_of(name) end

local function le(v, n) local b = {} for i = 1, n do b[i] = v % 256 v = math.floor(v / 256) end return string.char(unpack(b)) end
local function be(v, n) local b = {} for i = n, 1, -1 do b[i] = v % 256 v = math.floor(v / 256) end return string.char(unpack(b)) end

-- A u8 image [c,h,w] whose pixel values follow from seed.
local function pattern(c, h, w, seed)
  return kiln.tensor(H.filled({c, h, w}, function(i) return (i * 37 + seed * 101) % 256 end), {dtype = "u8"})
end

local function write_png(name, img) data.write_png(path_of(name), img) return path_of(name) end

-- A 24-bit BMP of img [3,h,w] (rows bottom-up, BGR, padded to 4 bytes).
local function bmp_bytes(img, w_decl, h_decl)
  local t = img:totable()
  local h, w = #t[1], #t[1][1]
  local rowsize = math.floor((w * 3 + 3) / 4) * 4
  local rows = {}
  for y = h, 1, -1 do
    local r = {}
    for x = 1, w do r[#r + 1] = string.char(t[3][y][x], t[2][y][x], t[1][y][x]) end
    local s = table.concat(r)
    rows[#rows + 1] = s .. string.rep("\0", rowsize - #s)
  end
  local body = table.concat(rows)
  return "BM" .. le(54 + #body, 4) .. le(0, 4) .. le(54, 4) .. le(40, 4) .. le(w_decl or w, 4) .. le(h_decl or h, 4) ..
         le(1, 2) .. le(24, 2) .. le(0, 4) .. le(#body, 4) .. le(2835, 4) .. le(2835, 4) .. le(0, 4) .. le(0, 4) .. body
end

-- An uncompressed 24-bit TGA (top-left origin, BGR).
local function tga_bytes(img)
  local t = img:totable()
  local h, w = #t[1], #t[1][1]
  local out = {string.char(0, 0, 2) .. le(0, 2) .. le(0, 2) .. string.char(0) .. le(0, 2) .. le(0, 2) .. le(w, 2) ..
               le(h, 2) .. string.char(24, 0x20)}
  for y = 1, h do for x = 1, w do out[#out + 1] = string.char(t[3][y][x], t[2][y][x], t[1][y][x]) end end
  return table.concat(out)
end

-- A binary PPM (P6).
local function ppm_bytes(img)
  local t = img:totable()
  local h, w = #t[1], #t[1][1]
  local out = {string.format("P6\n%d %d\n255\n", w, h)}
  for y = 1, h do for x = 1, w do out[#out + 1] = string.char(t[1][y][x], t[2][y][x], t[3][y][x]) end end
  return table.concat(out)
end

-- A 1x1 GIF of the colour (255, 0, 0): a 2-entry palette and LZW codes clear, 0, end.
local GIF_RED = "GIF89a\1\0\1\0\128\0\0\255\0\0\0\0\0,\0\0\0\0\1\0\1\0\0\2\2D\1\0;"

-- An 8x8 JPEG of the colour (200, 100, 50), written by stb_image_write at quality 75.
local JPEG_HEX = "ffd8ffe000104a46494600010100000100010000ffdb008400080606070605080707070909080a0c140d0c0b0b0c1912130f14" ..
  "1d1a1f1e1d1a1c1c20242e2720222c231c1c2837292c30313434341f27393d38323c2e333432010909090c0b0c180d0d183221" ..
  "1c2132323232323232323232323232323232323232323232323232323232323232323232323232323232323232323232323232" ..
  "32ffc00011080008000803012200021101031101ffc401a2000001050101010101010000000000000000010203040506070809" ..
  "0a0b100002010303020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f0" ..
  "2433627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a636465666768696a7374" ..
  "75767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2" ..
  "d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9fa0100030101010101010101010000000000000102030405" ..
  "060708090a0b1100020102040403040705040400010277000102031104052131061241510761711322328108144291a1b1c109" ..
  "233352f0156272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a6364656667" ..
  "68696a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5" ..
  "c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f008e8a28af9a" ..
  "3ec0ffd9"
local JPEG = JPEG_HEX:gsub("..", function(h) return string.char(tonumber(h, 16)) end)

-- A PNG signature and IHDR declaring w x h RGB pixels (stb_image does not check CRCs).
local function png_header(w, h)
  return "\137PNG\r\n\26\n" .. be(13, 4) .. "IHDR" .. be(w, 4) .. be(h, 4) .. string.char(8, 2, 0, 0, 0) .. be(0, 4)
end

-- root/<class>/<file>: 3 classes (written out of order) of RGB PNGs of 6x5 pixels.
local function make_folder(name, per_class)
  for k, class in ipairs({"cat", "ant", "bee"}) do
    mkdir(name .. "/" .. class)
    for i = 1, per_class do write_png(string.format("%s/%s/%02d.png", name, class, i), pattern(3, 6, 5, k * 100 + i)) end
  end
  return path_of(name)
end

setup(function()
  local p = assert(io.popen("mktemp -d /tmp/kiln-loader-spec-XXXXXX"))
  dir = p:read("*l")
  p:close()
  assert(dir and #dir > 0, "mktemp -d failed")
end)

teardown(function()
  if dir and dir:match("^/tmp/kiln%-loader%-spec%-") then os.execute("rm -rf '" .. dir .. "'") end
end)

-- ---- the order ----

-- splitmix64 Fisher-Yates written out again here, as kiln.data had it in Lua before the C loader.
local function lua_permutation(n, seed, epoch)
  local u64 = ffi.typeof("uint64_t")
  local G, M1, M2 = 0x9E3779B97F4A7C15ULL, 0xBF58476D1CE4E5B9ULL, 0x94D049BB133111EBULL
  local function mix(z)
    z = bit.bxor(z, bit.rshift(z, 30)) * M1
    z = bit.bxor(z, bit.rshift(z, 27)) * M2
    return bit.bxor(z, bit.rshift(z, 31))
  end
  local s = mix(ffi.cast(u64, ffi.cast("int64_t", seed)) + G) + mix(ffi.cast(u64, ffi.cast("int64_t", epoch)) * M1 + G)
  local p = {}
  for i = 0, n - 1 do p[i] = i end
  for i = n - 1, 1, -1 do
    s = s + G
    local u = tonumber(bit.rshift(mix(s), 11)) * 2 ^ -53
    local j = math.floor(u * (i + 1))
    p[i], p[j] = p[j], p[i]
  end
  local out = {}
  for i = 0, n - 1 do out[i + 1] = p[i] + 1 end
  return out
end

describe("data.DataLoader order", function()
  local n = 53
  local x = kiln.arange(0, n * 2):view(n, 2)
  local y = kiln.arange(1, n + 1):to("i64")
  local ds = data.TensorDataset(x, y)

  local function labels(loader, e, opts)
    local got = {}
    for xb, yb in loader:epoch(e, opts) do for _, v in ipairs(yb:totable()) do got[#got + 1] = v end end
    return got
  end

  it("is the splitmix64 Fisher-Yates permutation of (seed, epoch), as data.permutation gives it", function()
    for _, case in ipairs({{10, 1, 0}, {53, -7, 3}, {200, 2 ^ 40 + 3, 12}, {1, 5, 5}, {0, 1, 1}}) do
      assert.are.same(lua_permutation(case[1], case[2], case[3]),
                      data.permutation(case[1], {seed = case[2], epoch = case[3]}):totable())
    end
  end)

  it("equals data.batches' order for the same seed and epoch, on every worker count", function()
    for _, seed in ipairs({1, 99, -3}) do
      for epoch = 0, 2 do
        local want = {}
        for _, _, yb in data.batches(ds, {batch_size = 8, seed = seed, epoch = epoch}) do
          for _, v in ipairs(yb:totable()) do want[#want + 1] = v end
        end
        for workers = 0, 3 do
          local loader = data.DataLoader{dataset = ds, batch_size = 8, shuffle = true, seed = seed, workers = workers}
          assert.are.same(want, labels(loader, epoch))
          loader:close()
        end
      end
    end
  end)

  it("keeps the dataset's order without shuffle, and each sample's rows", function()
    local loader = data.DataLoader{dataset = ds, batch_size = 10, workers = 2}
    local b = 0
    for xb, yb in loader:epoch(4) do
      b = b + 1
      local first = (b - 1) * 10
      assert.are.same(kiln.arange(first * 2, (first + yb:size(1)) * 2):view(-1, 2):totable(), xb:totable())
      assert.are.same(kiln.arange(first + 1, first + yb:size(1) + 1):totable(), yb:totable())
    end
    assert.are.equal(6, b)
    assert.are.equal(6, loader:num_batches())
  end)

  it("drops the last short batch with drop_last", function()
    for workers = 0, 2 do
      local loader = data.DataLoader{dataset = ds, batch_size = 10, shuffle = true, seed = 1, drop_last = true, workers = workers}
      local sizes = {}
      for xb, yb in loader:epoch(1) do sizes[#sizes + 1] = yb:size(1) assert.are.equal(yb:size(1), xb:size(1)) end
      assert.are.same({10, 10, 10, 10, 10}, sizes)
      assert.are.equal(5, loader:num_batches())
    end
  end)

  it("skips the first batches of an epoch (to resume within it)", function()
    local loader = data.DataLoader{dataset = ds, batch_size = 8, shuffle = true, seed = 4, workers = 2}
    local all = labels(loader, 3)
    local tail = labels(loader, 3, {skip = 5})
    assert.are.same({unpack(all, 41)}, tail)
    assert.are.same({}, labels(loader, 3, {skip = 7}))
    assert_contains(err(function() loader:epoch(3, {skip = 8}) end), "first batch 8 for an epoch of 7 batches")
  end)

  it("takes the order from a sampler hook: a table or an i64 tensor of indices from 1", function()
    local calls = {}
    local sampler = function(epoch, size)
      calls[#calls + 1] = {epoch, size}
      local order = {}
      for i = epoch + 1, size, 4 do order[#order + 1] = i end   -- a shard: every 4th sample
      return order
    end
    for workers = 0, 2 do
      local loader = data.DataLoader{dataset = ds, batch_size = 3, sampler = sampler, workers = workers}
      assert.are.same({2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50}, labels(loader, 1))
      assert.are.equal(5, loader:num_batches())
    end
    assert.are.same({1, n}, calls[1])
    local loader = data.DataLoader{dataset = ds, batch_size = 4, workers = 1,
                                   sampler = function() return kiln.tensor({5, 5, 53, 1}, {dtype = "i64"}) end}
    assert.are.same({5, 5, 53, 1}, labels(loader, 0))
    local bad = data.DataLoader{dataset = ds, batch_size = 4, workers = 1, sampler = function() return {1, 54} end}
    assert_contains(err(function() bad:epoch(0) end), "sampler's entry 2 is 54, out of range for a dataset of 53 samples")
    local zero = data.DataLoader{dataset = ds, batch_size = 4, sampler = function() return {0} end}
    assert_contains(err(function() zero:epoch(0) end), "entry 1 is 0")
  end)

  it("collates a Lua dataset (len and get) on the calling thread, in the same order", function()
    local lua_ds = {len = function() return n end, get = function(_, i) return x[i], y[i] end}
    local loader = data.DataLoader{dataset = lua_ds, batch_size = 8, shuffle = true, seed = 7}
    local want = data.DataLoader{dataset = ds, batch_size = 8, shuffle = true, seed = 7, workers = 2}
    assert.are.same(labels(want, 2), labels(loader, 2))
    assert.is_true(loader.wait_seconds >= 0)
  end)

  it("rejects bad options with messages naming them", function()
    assert_contains(err(function() data.DataLoader{batch_size = 2} end), "dataset is missing")
    assert_contains(err(function() data.DataLoader{dataset = ds, batch_size = 0} end), "batch_size must be positive")
    assert_contains(err(function() data.DataLoader{dataset = ds, workers = -1} end), "-1 workers")
    assert_contains(err(function() data.DataLoader{dataset = ds, sampler = 3} end), "sampler must be a function")
    assert_contains(err(function() data.DataLoader{dataset = ds, transform = 3} end), "transform must be built with")
    local flat = data.DataLoader{dataset = ds, workers = 1, batch_size = 2}
    assert_contains(err(function() data.DataLoader{dataset = ds, transform = T.RandomHorizontalFlip()} end),
                    "transforms take samples that are images")
    flat:close()
    assert_contains(err(function() flat:epoch(0) end), "closed")
  end)
end)

-- ---- the same batches on every worker count ----

describe("data.DataLoader pin_memory and device", function()
  local ds = data.TensorDataset(kiln.arange(0, 20):view(10, 2), kiln.arange(1, 11):to("i64"))

  it("refuses pin_memory and a CUDA device at construction when no device is usable", function()
    if kiln.cuda.is_available() then return end   -- tests/gpu and the fake device cover the other case
    for _, opts in ipairs({{pin_memory = true}, {pin_memory = true, device = "cuda"}, {device = "cuda"},
                           {pin_memory = true, workers = 2}}) do
      opts.dataset, opts.batch_size = ds, 4
      local ok, err = pcall(data.DataLoader, opts)
      assert.is_false(ok)
      assert.matches("DataLoader: pin_memory: no CUDA device: ", err, 1, true)
      assert.matches(kiln.cuda.unavailable_reason(), err, 1, true)
    end
    local ok, err = pcall(data.DataLoader, {dataset = ds, device = "cuda:1", pin_memory = false})
    assert.is_false(ok)
    assert.matches("DataLoader: device cuda:1: no CUDA device", err, 1, true)
    ok, err = pcall(data.DataLoader, {dataset = {len = function() return 3 end, get = function(_, i) return kiln.ones(2) end},
                                      pin_memory = true})
    assert.is_false(ok)
    assert.matches("pin_memory: no CUDA device", err, 1, true)
  end)

  it("keeps batches on the cpu, unpinned, with device = 'cpu' and pin_memory off", function()
    local loader = data.DataLoader{dataset = ds, batch_size = 4, device = "cpu", pin_memory = false, workers = 1}
    assert.is_false(loader.pin_memory)
    for xb, yb in loader:epoch(0) do
      assert.is_false(xb:is_pinned())
      assert.equal("cpu", xb:device())
    end
    local ok, err = pcall(data.DataLoader, {dataset = ds, pin_memory = "yes"})
    assert.is_false(ok)
    assert.matches("pin_memory must be true or false", err)
  end)
end)

describe("data.DataLoader with workers", function()
  local aug = T.Compose{T.RandomCrop{8, padding = 2}, T.RandomHorizontalFlip(), T.RandomVerticalFlip(0.3),
                        T.RandomAffine{15, translate = {0.1, 0.1}}, T.Normalize{mean = {0.5, 0.4}, std = {0.2, 0.3}}}

  it("gives bitwise-identical batches on 0 to 3 workers: tensors in memory with random transforms", function()
    local n = 45
    local x = kiln.rand(n, 2, 9, 8)
    local y = kiln.arange(0, n):to("i64")
    local ds = data.TensorDataset(x, y)
    local ref
    for workers = 0, 3 do
      local loader = data.DataLoader{dataset = ds, batch_size = 7, shuffle = true, seed = 11, workers = workers,
                                     prefetch = workers + 1, transform = aug}
      local got = {epoch_bytes(loader, 0), epoch_bytes(loader, 1)}
      if ref then
        assert.are.equal(#ref[1], #got[1])
        for e = 1, 2 do for b = 1, #ref[e] do
          assert(got[e][b][1] == ref[e][b][1], string.format("epoch %d batch %d differs on %d workers", e - 1, b, workers))
          assert(got[e][b][2] == ref[e][b][2])
        end end
      else ref = got end
      loader:close()
    end
    -- the two epochs are augmented differently, and each sample is what the transform makes of it
    assert.are_not.equal(ref[1][1][1], ref[2][1][1])
    local loader = data.DataLoader{dataset = ds, batch_size = 5, shuffle = true, seed = 11, workers = 2, transform = aug}
    for xb, yb in loader:epoch(1) do
      for b = 1, yb:size(1) do
        local i = yb[b] + 1
        assert.are.equal(bytes_of(aug(x[i], {seed = 11, epoch = 1, index = i})), bytes_of(xb[b]))
      end
      break
    end
  end)

  it("gives bitwise-identical batches on 0 to 3 workers: an image folder with random transforms", function()
    local root = make_folder("same", 9)
    local ds = data.ImageFolder(root, {transform = T.Compose{T.Resize{7, 6}, T.RandomCrop{6, padding = 1},
                                                              T.RandomHorizontalFlip(), T.RandomAffine{10}}})
    local ref
    for workers = 0, 3 do
      local loader = data.DataLoader{dataset = ds, batch_size = 4, shuffle = true, seed = 3, workers = workers}
      local got = epoch_bytes(loader, 5)
      assert.are.equal(7, #got)
      if ref then
        for b = 1, #ref do assert(got[b][1] == ref[b][1] and got[b][2] == ref[b][2], "batch " .. b .. " differs") end
      else ref = got end
    end
  end)

  it("keeps a ring of prefetch batches and reports the time next waited", function()
    local x = kiln.rand(64, 3)
    local loader = data.DataLoader{dataset = data.TensorDataset(x), batch_size = 4, workers = 3, prefetch = 5}
    local count = 0
    for xb in loader:epoch(0) do count = count + 1 assert.are.same({4, 3}, xb:size()) end
    assert.are.equal(16, count)
    assert.are.equal("number", type(loader.wait_seconds))
    assert.is_true(loader.wait_seconds >= 0)
  end)

  it("iterates as `for x, y in loader do`: each loop the next epoch, a break ends it", function()
    local ds = data.TensorDataset(kiln.arange(10):float(), kiln.arange(10))
    for _, workers in ipairs{0, 2} do
      local loader = data.DataLoader{dataset = ds, batch_size = 4, shuffle = true, seed = 5, workers = workers}
      local ref = data.DataLoader{dataset = ds, batch_size = 4, shuffle = true, seed = 5, workers = 0}
      local function labels(iter)
        local r = {}
        for _, y in iter do for _, v in ipairs(y:totable()) do r[#r + 1] = v end end
        return r
      end
      assert.same(labels(ref:epoch(0)), labels(loader))
      assert.same(labels(ref:epoch(1)), labels(loader))
      for _ in loader do break end                       -- epoch 2, left after one batch
      assert.same(labels(ref:epoch(3)), labels(loader))  -- a new loop: the whole of epoch 3
      loader:close()
    end
  end)

  it("joins its workers when closed mid-epoch, and when collected", function()
    local x = kiln.rand(1000, 4)
    collectgarbage()
    collectgarbage()   -- loaders of earlier tests let go of their workers
    local before = threads()
    if not before then pending("no /proc/self/status") return end
    local loader = data.DataLoader{dataset = data.TensorDataset(x), batch_size = 2, workers = 3, prefetch = 4}
    assert.are.equal(before + 3, threads())
    for _ in loader:epoch(0) do break end
    loader:close()
    assert.are.equal(before, threads_settled(before))
    loader = data.DataLoader{dataset = data.TensorDataset(x), batch_size = 2, workers = 2}
    for _ in loader:epoch(0) do break end
    assert.are.equal(before + 2, threads())
    loader = nil
    collectgarbage()
    collectgarbage()
    assert.are.equal(before, threads_settled(before))
  end)
end)

-- ---- transforms against naive references ----

describe("data.transforms", function()
  -- a [2,3,4] f32 image with distinct values
  local img_t = H.filled({2, 3, 4}, function(i) return i * 1.5 - 4 end)
  local img = kiln.tensor(img_t)

  local function reversed(row) local r = {} for i = #row, 1, -1 do r[#r + 1] = row[i] end return r end

  it("flips left-right and top-bottom with probability 1, and never with 0", function()
    local want = {}
    for c = 1, 2 do want[c] = {} for y = 1, 3 do want[c][y] = reversed(img_t[c][y]) end end
    assert.tensor_near(T.RandomHorizontalFlip(1)(img), want, 0)
    want = {}
    for c = 1, 2 do want[c] = reversed(img_t[c]) end
    assert.tensor_near(T.RandomVerticalFlip{p = 1}(img), want, 0)
    assert.tensor_near(T.RandomHorizontalFlip(0)(img), img_t, 0)
    -- with p = 0.5 each index is one or the other, and both happen
    local seen = {}
    for i = 1, 40 do
      local out = T.RandomHorizontalFlip()(img, {index = i}):totable()
      local flipped = out[1][1][1] == img_t[1][1][4]
      assert.tensor_near(out, flipped and T.RandomHorizontalFlip(1)(img):totable() or img_t, 0)
      seen[flipped] = true
    end
    assert.is_true(seen[true] and seen[false])
  end)

  it("crops with padding at a window of the padded image, drawn per sample index", function()
    local pad, fill = 2, -9
    local function padded(c, y, x)
      local yy, xx = y - pad, x - pad
      if yy < 1 or yy > 3 or xx < 1 or xx > 4 then return fill end
      return img_t[c][yy][xx]
    end
    local offsets = {}
    for i = 1, 60 do
      local out = T.RandomCrop{{3, 4}, padding = pad, fill = fill}(img, {index = i, seed = 5}):totable()
      local found
      for top = 0, 2 * pad do
        for left = 0, 2 * pad do
          local ok = true
          for c = 1, 2 do for y = 1, 3 do for x = 1, 4 do
            if out[c][y][x] ~= padded(c, y + top, x + left) then ok = false end
          end end end
          if ok then found = top * 10 + left end
        end
      end
      assert(found, "sample " .. i .. " is no window of the padded image")
      offsets[found] = true
      -- the same index gives the same crop
      assert.tensor_near(T.RandomCrop{{3, 4}, padding = pad, fill = fill}(img, {index = i, seed = 5}), out, 0)
    end
    local distinct = 0
    for _ in pairs(offsets) do distinct = distinct + 1 end
    assert.is_true(distinct >= 10, "only " .. distinct .. " distinct windows in 60 samples")
    assert_contains(err(function() T.RandomCrop(9)(img) end), "padded by 0 is 3 x 4, smaller than the 9 x 9 crop")
  end)

  it("crops the centre as torchvision does, padding with 0 where the image is smaller", function()
    -- 3x4 -> 1x2: top = round((3-1)/2) = 1, left = round((4-2)/2) = 1
    assert.tensor_near(T.CenterCrop{1, 2}(img), {{{img_t[1][2][2], img_t[1][2][3]}}, {{img_t[2][2][2], img_t[2][2][3]}}}, 0)
    -- 3x4 -> 2x1: top = round(0.5) = 0 (half to even), left = round(1.5) = 2
    assert.tensor_near(T.CenterCrop{2, 1}(img), {{{img_t[1][1][3]}, {img_t[1][2][3]}}, {{img_t[2][1][3]}, {img_t[2][2][3]}}}, 0)
    -- 3x4 -> 5x4: one row of zeros above and below
    local want = {}
    for c = 1, 2 do want[c] = {{0, 0, 0, 0}, img_t[c][1], img_t[c][2], img_t[c][3], {0, 0, 0, 0}} end
    assert.tensor_near(T.CenterCrop{5, 4}(img), want, 0)
  end)

  it("normalises each channel by its mean and std", function()
    local out = T.Normalize{mean = {1, -2}, std = {2, 0.5}}(img)
    assert.tensor_near(out, H.filled({2, 3, 4}, function(i)
      local v, c = i * 1.5 - 4, i <= 12 and 1 or 2
      return c == 1 and (v - 1) / 2 or (v + 2) / 0.5
    end), 1e-6)
    assert.tensor_near(T.Normalize(0.5, 0.25)(img), H.map(img_t, function(v) return (v - 0.5) / 0.25 end), 1e-6)
    assert_contains(err(function() T.Normalize{mean = {1, 2, 3}, std = {1, 1, 1}}(img) end),
                    "3 means and stds for an image of 2 channels")
    assert_contains(err(function() T.Normalize{mean = {1}, std = {0}} (img) end), "std 0 is 0")
  end)

  it("resizes bilinearly with half-pixel centres (hand-computed values)", function()
    local tiny = kiln.tensor({{{0, 1}, {2, 3}}})
    assert.tensor_near(T.Resize{3, 3}(tiny), {{{0, 0.5, 1}, {1, 1.5, 2}, {2, 2.5, 3}}}, 1e-6)
    -- 4x4 -> 2x2 samples at 0.5 and 2.5: the mean of each 2x2 block
    local four = kiln.tensor({{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}})
    assert.tensor_near(T.Resize{2, 2}(four), {{{2.5, 4.5}, {10.5, 12.5}}}, 1e-6)
    -- Resize(n): the shorter side becomes n
    assert.are.same({1, 2, 3}, T.Resize(2)(kiln.zeros(1, 4, 6)):size())
    assert.are.same({1, 5, 2}, T.Resize(2)(kiln.zeros(1, 10, 4)):size())
  end)

  it("rotates and shifts like a naive bilinear reference drawn from the sample's Philox block", function()
    local H8, W8 = 7, 8
    local src = H.filled({1, H8, W8}, function(i) return math.sin(i) * 3 end)
    local t = kiln.tensor(src)
    local r = ffi.new("uint32_t[4]")
    for index = 1, 12 do
      C.kiln_sample_philox(21, 2, index - 1, 0, r)
      local u = {r[0] / 2 ^ 32, r[1] / 2 ^ 32, r[2] / 2 ^ 32}
      local angle = 30 * (2 * u[1] - 1)
      local function round_even(v)
        local f = math.floor(v)
        if v - f ~= 0.5 then return math.floor(v + 0.5) end
        return f % 2 == 0 and f or f + 1
      end
      local tx, ty = round_even(0.25 * W8 * (2 * u[2] - 1)), round_even(0.25 * H8 * (2 * u[3] - 1))
      local th = angle * math.pi / 180
      local cs, sn = math.cos(th), math.sin(th)
      local cx, cy = (W8 - 1) / 2, (H8 - 1) / 2
      local function at(y, x)   -- 0-based; outside: the fill (0)
        if y < 0 or y >= H8 or x < 0 or x >= W8 then return 0 end
        return src[1][y + 1][x + 1]
      end
      local want = {{}}
      for y = 0, H8 - 1 do
        want[1][y + 1] = {}
        for x = 0, W8 - 1 do
          local dx, dy = x - cx - tx, y - cy - ty
          local sx, sy = cx + dx * cs - dy * sn, cy + dx * sn + dy * cs
          local x0, y0 = math.floor(sx), math.floor(sy)
          local fx, fy = sx - x0, sy - y0
          want[1][y + 1][x + 1] = (1 - fx) * (1 - fy) * at(y0, x0) + fx * (1 - fy) * at(y0, x0 + 1) +
                                  (1 - fx) * fy * at(y0 + 1, x0) + fx * fy * at(y0 + 1, x0 + 1)
        end
      end
      assert.tensor_near(T.RandomAffine{30, translate = {0.25, 0.25}}(t, {seed = 21, epoch = 2, index = index}), want, 1e-5)
    end
    assert.tensor_near(T.RandomAffine(0)(t), src, 1e-6)
  end)

  it("composes in order and flattens nested Compose lists", function()
    local c = T.Compose{T.Compose{T.RandomHorizontalFlip(1), T.Normalize(1, 2)}, T.CenterCrop{2, 2}}
    local want = T.CenterCrop{2, 2}(T.Normalize(1, 2)(T.RandomHorizontalFlip(1)(img)))
    assert.are.equal(bytes_of(want), bytes_of(c(img)))
    assert.are.equal(3, #c.items)
    assert_contains(err(function() T.Compose{T.Resize(2), 5} end), "entry 2 is not a transform")
  end)
end)

-- ---- image folders ----

describe("data.ImageFolder", function()
  it("sorts classes and files by name, labels from 1, and decodes to [C,H,W] in [0, 1]", function()
    local root = make_folder("folder", 3)
    write("folder/ant/readme.txt", "not an image")
    write("folder/.hidden.png", "ignored")
    mkdir("folder/ant/deeper")
    write_png("folder/ant/deeper/00.png", pattern(3, 6, 5, 7))
    local ds = data.ImageFolder(root)
    assert.are.same({"ant", "bee", "cat"}, ds.classes)
    assert.are.equal(3, ds.class_to_idx.cat)
    assert.are.equal(10, ds:len())
    assert_contains(ds:file(1), "/folder/ant/01.png")
    assert_contains(ds:file(4), "/folder/ant/deeper/00.png")
    assert_contains(ds:file(5), "/folder/bee/01.png")
    assert.are.same({1, 1, 1, 1, 2, 2, 2, 3, 3, 3}, (function() local l = {} for i = 1, 10 do l[i] = ds:label(i) end return l end)())
    local x, y = ds:get(6)
    assert.are.equal(2, y:item())
    assert.tensor_near(x, H.map(pattern(3, 6, 5, 302):totable(), function(v) return v / 255 end), 1e-7)
    -- batches: images [B,3,6,5] f32 and labels [B] from 1
    local loader = data.DataLoader{dataset = ds, batch_size = 4, workers = 2}
    local labels = {}
    for xb, yb in loader:epoch(0) do
      assert.are.equal("f32", xb:dtype())
      assert.are.equal(3, xb:size(2))
      for _, v in ipairs(yb:totable()) do labels[#labels + 1] = v end
    end
    assert.are.same({1, 1, 1, 1, 2, 2, 2, 3, 3, 3}, labels)
  end)

  it("converts RGB to grey as stb_image does, and reads PNG, JPEG, BMP, GIF, TGA and PNM", function()
    local img = pattern(3, 4, 5, 9)
    mkdir("formats/all")
    write_png("formats/all/a.png", img)
    write("formats/all/b.bmp", bmp_bytes(img))
    write("formats/all/c.tga", tga_bytes(img))
    write("formats/all/d.ppm", ppm_bytes(img))
    local want = H.map(img:totable(), function(v) return v / 255 end)
    for _, name in ipairs({"a.png", "b.bmp", "c.tga", "d.ppm"}) do
      assert.tensor_near(data.read_image(path_of("formats/all/" .. name)):to("f64"):div(255), want, 1e-12)
    end
    local t = img:totable()
    local grey = {{}}
    for y = 1, 4 do
      grey[1][y] = {}
      for x = 1, 5 do grey[1][y][x] = bit.rshift(t[1][y][x] * 77 + t[2][y][x] * 150 + t[3][y][x] * 29, 8) end
    end
    assert.tensor_near(data.read_image(path_of("formats/all/a.png"), 1), grey, 0)
    write("formats/all/e.gif", GIF_RED)
    assert.tensor_near(data.read_image(path_of("formats/all/e.gif")), {{{255}}, {{0}}, {{0}}}, 0)
    write("formats/all/f.jpg", JPEG)
    assert.tensor_near(data.read_image(path_of("formats/all/f.jpg")), H.filled({3, 8, 8}, function(i) return ({200, 100, 50})[math.ceil(i / 64)] end), 0)
    local ds = data.ImageFolder(path_of("formats"), {channels = 1, transform = T.Resize{3, 3}})
    assert.are.equal(6, ds:len())
    local loader = data.DataLoader{dataset = ds, batch_size = 6, workers = 1}
    for xb, yb in loader:epoch(0) do
      assert.are.same({6, 1, 3, 3}, xb:size())
      assert.are.same({1, 1, 1, 1, 1, 1}, yb:totable())
    end
  end)

  it("names a class folder without images, a missing root and a root without classes", function()
    make_folder("noimages", 1)
    mkdir("noimages/dog")
    write("noimages/dog/notes.txt", "x")
    assert_contains(err(function() data.ImageFolder(path_of("noimages")) end), "/noimages/dog holds no images")
    assert_contains(err(function() data.ImageFolder(path_of("missing")) end), "/missing", "No such file")
    mkdir("flat")
    write_png("flat/a.png", pattern(3, 2, 2, 1))
    assert_contains(err(function() data.ImageFolder(path_of("flat")) end), "holds no class folders")
    assert_contains(err(function() data.ImageFolder(path_of("flat"), {channels = 7}) end), "7 channels")
  end)

  it("says which samples disagree in size", function()
    mkdir("sizes/a")
    write_png("sizes/a/1.png", pattern(3, 4, 4, 1))
    write_png("sizes/a/2.png", pattern(3, 5, 4, 2))
    local loader = data.DataLoader{dataset = data.ImageFolder(path_of("sizes")), batch_size = 2, workers = 1}
    local msg = err(function() for _ in loader:epoch(0) do end end)
    assert_contains(msg, "sizes/a/2.png", "is [3,5,4] after the transforms", "sizes/a/1.png", "is [3,4,4]", "Resize or CenterCrop")
  end)
end)

-- ---- bad input ----

describe("data.DataLoader on bad files", function()
  local good = pattern(3, 6, 5, 1)
  local png = nil

  local cases = {
    {"corrupt.png", function(p) write(p, "\137PNG\r\n\26\n" .. string.rep("garbage!", 8)) end, "corrupt PNG"},
    {"truncated.png", function(p) write(p, png:sub(1, math.floor(#png / 2))) end, "truncated PNG"},
    {"empty.png", function(p) write(p, "") end, "empty file (0 bytes)"},
    {"huge.png", function(p) write(p, png_header(100000, 100000)) end,
     "declares 100000 x 100000 pixels (3 channels in the file, 3 wanted): decoding them takes about 60000000000 bytes, "
     .. "more than the limit"},
    {"huge.bmp", function(p) write(p, bmp_bytes(good, 100000, 100000)) end, "declares 100000 x 100000 pixels"},
    {"zero.png", function(p) write(p, png_header(0, 5)) end, "declares a zero size (0 x 5 pixels)"},
    {"notimage.jpg", function(p) write(p, "hello, world") end, "not an image kiln reads"},
    {"dangling.png", function(p) os.execute("ln -s '" .. dir .. "/nowhere' '" .. path_of(p) .. "'") end,
     "a symbolic link to a missing file"},
    {"fifo.png", function(p) os.execute("mkfifo '" .. path_of(p) .. "'") end, "is a FIFO (named pipe), not a regular file"},
  }

  for k, case in ipairs(cases) do
    it("names " .. case[1] .. " (" .. case[3] .. ") at the batch that needs it, without a hang", function()
      png = png or (function()
        local p = write_png("good.png", good)
        local f = io.open(p, "rb") local s = f:read("*a") f:close() return s
      end)()
      local name = "bad" .. k
      mkdir(name .. "/a")
      for i = 1, 5 do write_png(string.format("%s/a/%d.png", name, i), good) end
      case[2](name .. "/a/3" .. case[1])      -- sorts between 3.png and 4.png: sample 4
      local ds = data.ImageFolder(path_of(name))
      assert.are.equal(6, ds:len())
      for workers = 0, 3 do
        local loader = data.DataLoader{dataset = ds, batch_size = 2, workers = workers, prefetch = 3}
        local batches = 0
        local msg = err(function() for _ in loader:epoch(0) do batches = batches + 1 end end)
        assert.are.equal(1, batches)
        assert_contains(msg, name .. "/a/3" .. case[1], case[3])
        assert_contains(msg, "sample 4 (", "of batch 2, epoch 0")   -- counted from 1, as everything in Lua
        -- the next call of the epoch says it again; the loader is freed and a new one works
        loader:close()
        local ok = data.DataLoader{dataset = ds, batch_size = 2, workers = workers, sampler = function() return {1, 2, 3, 5, 6} end}
        local n = 0
        for xb in ok:epoch(0) do n = n + xb:size(1) end
        assert.are.equal(5, n)
      end
      assert_contains(err(function() ds:get(4) end), "3" .. case[1], case[3])
    end)
  end

  it("stops its 2 workers at a corrupt file mid-epoch: no thread is left running", function()
    png = png or (function()
      local p = write_png("good.png", good)
      local f = io.open(p, "rb") local s = f:read("*a") f:close() return s
    end)()
    mkdir("stopping/a")
    for i = 1, 9 do write_png(string.format("stopping/a/%d.png", i), good) end
    write("stopping/a/5corrupt.png", "\137PNG\r\n\26\n" .. string.rep("garbage!", 8))   -- sample 6
    collectgarbage()
    collectgarbage()
    local before = threads()
    if not before then pending("no /proc/self/status") return end
    local loader = data.DataLoader{dataset = data.ImageFolder(path_of("stopping")), batch_size = 2, workers = 2}
    assert.are.equal(before + 2, threads())
    local msg = err(function() for _ in loader:epoch(0) do end end)
    assert_contains(msg, "stopping/a/5corrupt.png", "corrupt PNG", "sample 6 (", "of batch 3, epoch 0")
    -- the loader is still referenced: its workers stopped on their own at the error
    assert.are.equal(before, threads_settled(before))
    assert.truthy(loader)
  end)

  it("searches folders named like images (and linked folders) rather than reading them", function()
    mkdir("baddir/a/x.png")
    write_png("baddir/a/y.png", good)
    local ds = data.ImageFolder(path_of("baddir"))
    assert.are.equal(1, ds:len())   -- a folder named x.png is searched, not read
    mkdir("baddir2/a")
    os.execute("ln -s '" .. dir .. "/baddir/a' '" .. dir .. "/baddir2/a/link.png'")
    write_png("baddir2/a/z.png", good)
    assert.are.equal(2, data.ImageFolder(path_of("baddir2")):len())
  end)
end)
