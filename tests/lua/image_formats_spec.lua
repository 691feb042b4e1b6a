-- Images the formats allow, decoded against pixels written by hand: top-down BMPs, PNM of any
-- maxval from 1 to 65535 (16-bit samples scaled to 8 bits, rounded), and PNM headers that are
-- refused before anything reads past them.
local kiln = require "kiln"
local data = kiln.data

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)
local function file(name, bytes)
  local path = dir .. "/" .. name
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  return path
end
local function le(v, n) local b = {} for i = 1, n do b[i] = v % 256 v = math.floor(v / 256) end return string.char(unpack(b)) end

-- A BMP of rows given top first (each {B, G, R[, A]} per pixel), stored top-down (negative height).
local function topdown_bmp(rows, bits)
  local h, w = #rows, #rows[1]
  local bpp = bits / 8
  local rowsize = math.floor((w * bpp + 3) / 4) * 4
  local body = {}
  for y = 1, h do
    local r = {}
    for x = 1, w do r[#r + 1] = string.char(unpack(rows[y][x], 1, bpp)) end
    local s = table.concat(r)
    body[#body + 1] = s .. string.rep("\0", rowsize - #s)
  end
  body = table.concat(body)
  return "BM" .. le(54 + #body, 4) .. le(0, 4) .. le(54, 4) .. le(40, 4) .. le(w, 4) .. le(2 ^ 32 - h, 4) ..
         le(1, 2) .. le(bits, 2) .. le(0, 4) .. le(#body, 4) .. le(2835, 4) .. le(2835, 4) .. le(0, 4) .. le(0, 4) .. body
end

local function be16(v) return string.char(math.floor(v / 256), v % 256) end
local function be32(v) return string.char(math.floor(v / 2 ^ 24) % 256, math.floor(v / 2 ^ 16) % 256, math.floor(v / 256) % 256, v % 256) end

-- A 16-bit greyscale PNG of samples (row by row), its IDAT one stored (uncompressed) deflate block.
local bit = require "bit"
local function crc32(s)
  local c = 0xffffffff
  for i = 1, #s do
    c = bit.bxor(c, s:byte(i))
    for _ = 1, 8 do c = bit.band(c, 1) ~= 0 and bit.bxor(bit.rshift(c, 1), 0xedb88320) or bit.rshift(c, 1) end
  end
  c = bit.bnot(c)
  return c < 0 and c + 2 ^ 32 or c
end
local function chunk(kind, body) return be32(#body) .. kind .. body .. be32(crc32(kind .. body)) end
local function png16_grey(w, h, samples)
  local raw = {}
  for y = 0, h - 1 do
    raw[#raw + 1] = "\0"   -- filter: none
    for x = 1, w do raw[#raw + 1] = be16(samples[y * w + x]) end
  end
  raw = table.concat(raw)
  local a, b = 1, 0
  for i = 1, #raw do a = (a + raw:byte(i)) % 65521 b = (b + a) % 65521 end
  local n = #raw
  local z = "\120\1" .. "\1" .. string.char(n % 256, math.floor(n / 256), 255 - n % 256, 255 - math.floor(n / 256)) .. raw .. be32(b * 65536 + a)
  return "\137PNG\r\n\26\n" .. chunk("IHDR", be32(w) .. be32(h) .. "\16\0\0\0\0") .. chunk("IDAT", z) .. chunk("IEND", "")
end

describe("image formats", function()
  it("reads top-down BMPs, 24- and 32-bit, upright", function()
    -- top row: red, green, blue; bottom row: white, black, grey
    local px = {{{0, 0, 255, 0}, {0, 255, 0, 0}, {255, 0, 0, 0}}, {{255, 255, 255, 0}, {0, 0, 0, 0}, {128, 128, 128, 0}}}
    local want = {{{255, 0, 0}, {255, 0, 128}}, {{0, 255, 0}, {255, 0, 128}}, {{0, 0, 255}, {255, 0, 128}}}
    for _, bits in ipairs{24, 32} do
      local img = data.read_image(file("td" .. bits .. ".bmp", topdown_bmp(px, bits)), 3)
      assert.same({3, 2, 3}, {img:size(1), img:size(2), img:size(3)})
      assert.same(want, img:totable(), bits .. "-bit")
    end
  end)

  it("keeps 16-bit samples where asked (depth = 16): PNM of any maxval, 16-bit PNG, 8-bit files widened", function()
    local pgm16 = "P5 4 1 65535\n" .. be16(65535) .. be16(32768) .. be16(257) .. be16(0)
    local img = data.read_image(file("k16.pgm", pgm16), {channels = 1, depth = 16})
    assert.are.equal("i32", img:dtype())
    assert.same({{{65535, 32768, 257, 0}}}, img:totable())
    -- maxval 1000: 1000, 500, 1 -> 65535, 32768 (32767.5 rounded up), 66 (65.535)
    local ppm16 = "P6\n1 1\n1000\n" .. be16(1000) .. be16(500) .. be16(1)
    assert.same({{{65535}}, {{32768}}, {{66}}}, data.read_image(file("k16.ppm", ppm16), {channels = 3, depth = 16}):totable())
    -- an 8-bit file: v * 257
    assert.same({{{0, 257 * 128, 65535}}}, data.read_image(file("k8.pgm", "P5\n3 1\n255\n\0\128\255"), {channels = 1, depth = 16}):totable())
    -- a 16-bit grey PNG written here (stored deflate blocks): its samples, and their high bytes at depth 8
    local png = png16_grey(3, 2, {0, 1, 65535, 4660, 43981, 256})
    local path = file("g16.png", png)
    assert.same({{{0, 1, 65535}, {4660, 43981, 256}}}, data.read_image(path, {channels = 1, depth = 16}):totable())
    assert.same({{{0, 0, 255}, {18, 171, 1}}}, data.read_image(path, 1):totable())
    assert.has_error(function() data.read_image(path, {depth = 12}) end, "image: " .. path .. ": a depth of 12 bits requested (expected 8 or 16)")
    assert.has_error(function() data.read_image(path, {dept = 16}) end)
  end)

  it("refuses a PNG whose chunk declares more bytes than the file has, before stb_image allocates them", function()
    -- a 16-bit grey PNG whose IDAT claims 2^31 - 1 bytes: stb_image would grow its buffer to that first
    local png = png16_grey(3, 2, {0, 1, 2, 3, 4, 5})
    local bomb = png:sub(1, 33) .. be32(2 ^ 31 - 1) .. png:sub(38)
    local path = file("bomb.png", bomb)
    assert.has_error(function() data.read_image(path, 1) end,
                     "image: " .. path .. ": truncated PNG: the IDAT chunk at offset 33 declares 2147483647 bytes, the file has "
                     .. (#bomb - 41) .. " after its header")
    assert.has_error(function() data.read_image(file("nohdr.png", "\137PNG\r\n\26\n" .. be32(13) .. "IDAT" .. string.rep("\0", 20)), 1) end,
                     "image: " .. dir .. "/nohdr.png: corrupt PNG: the first chunk is \"IDAT\" of 13 bytes, not the header (IHDR, 13 bytes)")
  end)

  it("reads PGM and PPM of any maxval, scaling to 8 bits with rounding", function()
    -- maxval 100: 0, 50, 100 -> 0, 128, 255
    assert.same({{{0, 128, 255}}}, data.read_image(file("m100.pgm", "P5\n3 1\n100\n\0\50\100"), 1):totable())
    -- 16-bit: 65535, 32768, 257, 0 -> 255, 128, 1, 0
    local pgm16 = "P5 4 1 65535\n" .. be16(65535) .. be16(32768) .. be16(257) .. be16(0)
    assert.same({{{255, 128, 1, 0}}}, data.read_image(file("p16.pgm", pgm16), 1):totable())
    -- a 16-bit PPM with maxval 1000, one pixel (1000, 500, 1): (255, 128, 0)
    local ppm16 = "P6\n# a comment\n1 1\n1000\n" .. be16(1000) .. be16(500) .. be16(1)
    assert.same({{{255}}, {{128}}, {{0}}}, data.read_image(file("p16.ppm", ppm16), 3):totable())
    -- maxval 1: a bitmap in bytes
    assert.same({{{0, 255}}}, data.read_image(file("m1.pgm", "P5\n2 1\n1\n\0\1"), 1):totable())
    -- grey to RGB: the grey value in each channel; and the file's own channels with 0
    assert.same({{{128}}, {{128}}, {{128}}}, data.read_image(file("g.pgm", "P5 1 1 100\n\50"), 3):totable())
    assert.are.equal(1, data.read_image(file("g0.pgm", "P5 1 1 100\n\50"), 0):size(1))
    -- a sample above maxval is clipped to white
    assert.same({{{255}}}, data.read_image(file("over.pgm", "P5 1 1 100\n\200"), 1):totable())
  end)

  it("refuses PNM headers that cannot be right, naming the file and the field", function()
    local cases = {
      {"maxval0.pgm", "P5\n1 1\n0\n\0", "maxval 0 %(expected 1 to 65535%)"},
      {"maxval70000.pgm", "P5\n1 1\n70000\n\0\0", "maxval 70000"},
      {"digits.pgm", "P5\n123456789012345678901 1\n255\n\0", "the width at offset 2 is larger than 2147483647"},
      {"zero.pgm", "P5\n0 4\n255\n", "zero size %(0 x 4 pixels%)"},
      {"noheight.pgm", "P5\n4\n", "truncated PNM: the header ends before the height"},
      {"letters.pgm", "P5\n4 x\n255\n", "expected the height at offset 5"},
      {"short16.pgm", "P5\n2 2\n65535\n" .. be16(1) .. be16(2), "truncated PNM: 2 x 2 pixels of 2 bytes need 8 bytes"},
      {"nospace.pgm", "P5\n1 1\n255", "no whitespace after the maxval"},
    }
    for _, c in ipairs(cases) do
      local path = file(c[1], c[2])
      local ok, err = pcall(data.read_image, path, 1)
      assert.is_false(ok, c[1])
      assert.truthy(tostring(err):find(path, 1, true), tostring(err))
      assert.matches(c[3], tostring(err), c[1])
    end
    -- and the process goes on
    assert.same({{{7}}}, data.read_image(file("ok.pgm", "P5 1 1 255\n\7"), 1):totable())
  end)
end)
