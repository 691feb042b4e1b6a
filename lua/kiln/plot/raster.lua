-- kiln.plot.raster: a small rasteriser for kiln.plot's PNG output: an RGB u8 tensor [3,H,W] drawn
-- in place through its data pointer, with antialiased lines and circles (coverage from the distance
-- to the shape), alpha blending, and text in the bitmap font of kiln.plot.font.
local core = require "kiln.core"
local factory = require "kiln.factory"
local font = require "kiln.plot.font"

local ffi = core.ffi
local floor, ceil, max, min, sqrt = math.floor, math.ceil, math.max, math.min, math.sqrt

local M = {}

local Canvas = {}
Canvas.__index = Canvas

-- A white canvas of width x height pixels.
function M.canvas(width, height)
  local t = factory.full({3, height, width}, 255, {dtype = "u8"})
  local ptr = ffi.cast("uint8_t *", t.p.storage.data) + t.p.offset
  return setmetatable({tensor = t, ptr = ptr, w = width, h = height, plane = width * height}, Canvas)
end

-- Blends colour c ({r, g, b}, 0-255) into pixel (x, y) with coverage a in [0, 1].
function Canvas:blend(x, y, c, a)
  if x < 0 or y < 0 or x >= self.w or y >= self.h or a <= 0 then return end
  if a > 1 then a = 1 end
  local i = y * self.w + x
  local p, n = self.ptr, self.plane
  for k = 0, 2 do
    local old = p[i + k * n]
    p[i + k * n] = floor(old + (c[k + 1] - old) * a + 0.5)
  end
end

function Canvas:rect(x, y, w, h, c, alpha)
  alpha = alpha or 1
  local x0, y0 = max(0, floor(x + 0.5)), max(0, floor(y + 0.5))
  local x1, y1 = min(self.w, floor(x + w + 0.5)), min(self.h, floor(y + h + 0.5))
  for py = y0, y1 - 1 do
    for px = x0, x1 - 1 do self:blend(px, py, c, alpha) end
  end
end

-- A segment of the given width; coverage falls off over the last pixel of its edge.
function Canvas:segment(x0, y0, x1, y1, c, width, alpha)
  local hw = (width or 1) / 2
  local dx, dy = x1 - x0, y1 - y0
  local len2 = dx * dx + dy * dy
  local bx0, bx1 = max(0, floor(min(x0, x1) - hw - 1)), min(self.w - 1, ceil(max(x0, x1) + hw + 1))
  local by0, by1 = max(0, floor(min(y0, y1) - hw - 1)), min(self.h - 1, ceil(max(y0, y1) + hw + 1))
  for py = by0, by1 do
    local cy = py + 0.5
    for px = bx0, bx1 do
      local cx = px + 0.5
      local t = len2 > 0 and ((cx - x0) * dx + (cy - y0) * dy) / len2 or 0
      if t < 0 then t = 0 elseif t > 1 then t = 1 end
      local ex, ey = cx - (x0 + t * dx), cy - (y0 + t * dy)
      local d = sqrt(ex * ex + ey * ey)
      local cover = hw + 0.5 - d
      if cover > 0 then self:blend(px, py, c, min(cover, 1) * alpha) end
    end
  end
end

-- A polyline {x1, y1, x2, y2, ...}: each pixel takes the largest coverage of any segment, so that
-- joints of a faint line are not darker than its segments.
function Canvas:polyline(pts, c, width, alpha)
  alpha = alpha or 1
  local n = #pts / 2
  if n == 1 then return self:circle(pts[1], pts[2], (width or 1) / 2, c, alpha) end
  local cover = {}
  local hw = (width or 1) / 2
  local W = self.w
  for s = 1, n - 1 do
    local x0, y0, x1, y1 = pts[2 * s - 1], pts[2 * s], pts[2 * s + 1], pts[2 * s + 2]
    local dx, dy = x1 - x0, y1 - y0
    local len2 = dx * dx + dy * dy
    local bx0, bx1 = max(0, floor(min(x0, x1) - hw - 1)), min(self.w - 1, ceil(max(x0, x1) + hw + 1))
    local by0, by1 = max(0, floor(min(y0, y1) - hw - 1)), min(self.h - 1, ceil(max(y0, y1) + hw + 1))
    for py = by0, by1 do
      local cy = py + 0.5
      for px = bx0, bx1 do
        local cx = px + 0.5
        local t = len2 > 0 and ((cx - x0) * dx + (cy - y0) * dy) / len2 or 0
        if t < 0 then t = 0 elseif t > 1 then t = 1 end
        local ex, ey = cx - (x0 + t * dx), cy - (y0 + t * dy)
        local cv = hw + 0.5 - sqrt(ex * ex + ey * ey)
        if cv > 0 then
          local key = py * W + px
          if cv > 1 then cv = 1 end
          if (cover[key] or 0) < cv then cover[key] = cv end
        end
      end
    end
  end
  for key, cv in pairs(cover) do self:blend(key % W, floor(key / W), c, cv * alpha) end
end

function Canvas:circle(x, y, r, c, alpha)
  alpha = alpha or 1
  for py = max(0, floor(y - r - 1)), min(self.h - 1, ceil(y + r + 1)) do
    for px = max(0, floor(x - r - 1)), min(self.w - 1, ceil(x + r + 1)) do
      local dx, dy = px + 0.5 - x, py + 0.5 - y
      local cover = r + 0.5 - sqrt(dx * dx + dy * dy)
      if cover > 0 then self:blend(px, py, c, min(cover, 1) * alpha) end
    end
  end
end

-- The width in pixels of s in the bitmap font.
function M.text_width(s)
  local w = 0
  for i = 1, #s do
    local g = font.glyphs[s:byte(i)] or font.glyphs[63]
    w = w + g[1]
  end
  return w
end

M.font_height = font.height
M.font_ascent = font.ascent

-- Text with its baseline at y; anchor "start" (x is the left), "middle" or "end".
function Canvas:text(x, y, s, c, anchor)
  s = tostring(s)
  local w = M.text_width(s)
  if anchor == "middle" then x = x - w / 2 elseif anchor == "end" then x = x - w end
  x = floor(x + 0.5)
  local top = floor(y + 0.5) - font.ascent
  for i = 1, #s do
    local g = font.glyphs[s:byte(i)] or font.glyphs[63]
    for row = 2, #g do
      local line = g[row]
      for col = 1, #line do
        local v = tonumber(line:sub(col, col), 16)
        if v > 0 then self:blend(x + col - 1, top + row - 2, c, v / 15) end
      end
    end
    x = x + g[1]
  end
end

-- An RGB image (a u8 tensor [3,h,w], contiguous on the cpu) at (x, y), each pixel scale x scale.
function Canvas:image(x, y, img, scale)
  scale = scale or 1
  local h, w = img:size(2), img:size(3)
  local src = ffi.cast("uint8_t *", img.p.storage.data) + img.p.offset
  local plane = h * w
  x, y = floor(x + 0.5), floor(y + 0.5)
  for sy = 0, h - 1 do
    for sx = 0, w - 1 do
      local c = {src[sy * w + sx], src[plane + sy * w + sx], src[2 * plane + sy * w + sx]}
      for dy = 0, scale - 1 do
        for dx = 0, scale - 1 do self:blend(x + sx * scale + dx, y + sy * scale + dy, c, 1) end
      end
    end
  end
end

return M
