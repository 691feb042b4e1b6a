-- tools/plot_font.lua: writes lua/kiln/plot/font.lua, the bitmap font of kiln.plot's PNG text:
-- DejaVu Sans at 11 px (Debian's fonts-dejavu-core) as headless Chromium draws it, each glyph's
-- coverage in 16 levels. usage: kiln tools/plot_font.lua   (needs chromium; run from the source tree)
local kiln = kiln or require "kiln"
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. dir) == 0)
local CELL, COLS, FIRST, LAST = 20, 16, 32, 126
local parts = {}
for c = FIRST, LAST do
  local i = c - FIRST
  local ch = string.char(c):gsub("[&<>]", {["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;"})
  parts[#parts + 1] = string.format('<div style="position:absolute;left:%dpx;top:%dpx;height:%dpx;line-height:%dpx">%s</div>',
                                    (i % COLS) * CELL + 2, math.floor(i / COLS) * CELL, CELL, CELL, ch)
end
local f = assert(io.open(dir .. "/font.html", "w"))
f:write("<!DOCTYPE html><html><body style=\"margin:0;background:#fff;color:#000;font:11px 'DejaVu Sans'\">",
        table.concat(parts), "</body></html>")
f:close()
assert(os.execute(string.format("chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 "
                                .. "--screenshot=%s/font.png --window-size=%d,%d file://%s/font.html >/dev/null 2>&1",
                                dir, COLS * CELL, 6 * CELL, dir)) == 0)
local img = kiln.data.read_image(dir .. "/font.png", 1)[1]   -- [H,W] u8
local function ink(x, y) return 255 - img[y + 1][x + 1] end
-- the rows any glyph inks, in cell coordinates
local top, bottom = CELL, -1
for c = FIRST, LAST do
  local i = c - FIRST
  local x0, y0 = (i % COLS) * CELL, math.floor(i / COLS) * CELL
  for y = 0, CELL - 1 do for x = 0, CELL - 1 do
    if ink(x0 + x, y0 + y) > 24 then top, bottom = math.min(top, y), math.max(bottom, y) end
  end end
end
-- the baseline: under the last inked row of H
local hb = -1
do
  local i = string.byte("H") - FIRST
  local x0, y0 = (i % COLS) * CELL, math.floor(i / COLS) * CELL
  for y = 0, CELL - 1 do for x = 0, CELL - 1 do if ink(x0 + x, y0 + y) > 24 then hb = math.max(hb, y) end end end
end
local out = {"-- kiln.plot.font: a bitmap font for kiln.plot's PNG text, written by tools/plot_font.lua: DejaVu Sans",
             "-- (Bitstream Vera license) at 11 px as Chromium draws it. Each glyph: advance (pixels) and rows of",
             "-- coverage, one hex digit (0-f) a pixel, from the left edge of the glyph's box; ascent: rows above the baseline.",
             "return {", string.format("  height = %d,", bottom - top + 1), string.format("  ascent = %d,", hb - top + 1), "  glyphs = {"}
for c = FIRST, LAST do
  local i = c - FIRST
  local x0, y0 = (i % COLS) * CELL, math.floor(i / COLS) * CELL
  local left, right = CELL, -1
  for y = top, bottom do for x = 0, CELL - 1 do
    if ink(x0 + x, y0 + y) > 24 then left, right = math.min(left, x), math.max(right, x) end
  end end
  local rows = {}
  local advance
  if right < 0 then advance, left, right = 3, 2, 1
  else advance = right - 2 + 2 end
  for y = top, bottom do
    local r = {}
    for x = 2, math.max(right, 2) do r[#r + 1] = string.format("%x", math.floor(ink(x0 + x, y0 + y) / 16)) end
    rows[#rows + 1] = '"' .. table.concat(r) .. '"'
  end
  out[#out + 1] = string.format("    [%d] = {%d, %s},", c, advance, table.concat(rows, ", "))
end
out[#out + 1] = "  },"
out[#out + 1] = "}"
local g = assert(io.open("lua/kiln/plot/font.lua", "w"))
g:write(table.concat(out, "\n"), "\n")
g:close()
os.execute("rm -rf " .. dir)
