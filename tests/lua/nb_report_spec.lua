-- The HTML report as a browser shows it: headless Chromium takes a screenshot of the report of a
-- notebook that plots y = x^2, and the plotted curve must be where the data puts it (relative to
-- the curve's own extent in the screenshot); the report references nothing on the network.
local N = require "nb_helpers"
local plot = require "kiln.plot"

local BOOK = [[
-- %% [markdown]
-- # A curve

-- %%
local xs, ys = {}, {}
for i = 0, 40 do xs[#xs + 1] = i / 4 ys[#ys + 1] = (i / 4) ^ 2 end
kiln.display(kiln.plot.line({x = xs, y = ys}, {title = "y = x^2"}))
]]

local function chromium()
  for _, name in ipairs{"chromium", "chromium-browser", "google-chrome"} do
    local out, status = N.sh("command -v " .. name)
    if status == 0 then return (out:gsub("%s+$", "")) end
  end
end

describe("the report in a browser", function()
  local dir, exe
  setup(function()
    exe = N.exe()
    dir = N.tmpdir("report")
    N.write(dir .. "/curve.lua", BOOK)
  end)
  teardown(function() N.rmdir(dir) end)

  it("shows the plotted curve where the data puts it", function()
    if not exe then pending("not running under the kiln launcher") return end
    local browser = chromium()
    if not browser then pending("chromium is not installed (sudo apt-get install chromium)") return end
    local out, status = N.sh(string.format("cd %s && %s nb run curve.lua -o report", dir, exe))
    assert.equal(0, status, out)
    local html = N.read(dir .. "/report/curve.html")
    assert.falsy(html:lower():find("http", 1, true))
    assert.truthy(html:find("<svg", 1, true))
    out, status = N.sh(string.format("cd %s && timeout 60 %s --headless --no-sandbox --disable-gpu --hide-scrollbars "
                                     .. "--force-device-scale-factor=1 --user-data-dir=%s/profile --screenshot=%s/shot.png "
                                     .. "--window-size=1000,900 file://%s/report/curve.html", dir, browser, dir, dir, dir))
    assert.equal(0, status, out)
    local img = kiln.data.read_image(dir .. "/shot.png", 3):to("i32")
    local H, W = img:size(2), img:size(3)
    -- the pixels of the series' colour
    local want = plot.colors[1]
    local d = (img[1] - want[1]):abs() + (img[2] - want[2]):abs() + (img[3] - want[3]):abs()
    local mask = d:lt(60)
    local count = mask:sum():item()
    assert.truthy(count > 300, "only " .. count .. " pixels of the curve's colour")
    local function extent(v)   -- the first and last index (from 0) where v is true
      local first, last
      for i, b in ipairs(v:tolist()) do if b == true or b == 1 then first = first or i - 1 last = i - 1 end end
      return first, last
    end
    local y0, y1 = extent(mask:any(2))
    local x0, x1 = extent(mask:any(1))
    -- the same plot, laid out alone: the curve's extent and where each data point goes
    local xs, ys = {}, {}
    for i = 0, 40 do xs[#xs + 1] = i / 4 ys[#ys + 1] = (i / 4) ^ 2 end
    local p = plot.line({x = xs, y = ys}, {title = "y = x^2"})
    local left, bottom = p:to_pixel(0, 0)
    local right, top = p:to_pixel(10, 100)
    assert.near(right - left, x1 - x0, 4)
    assert.near(bottom - top, y1 - y0, 4)
    local rows_of_mask = mask:tolist()
    local function blue_near(x, y)
      for dy = -2, 2 do for dx = -2, 2 do
        local yy, xx = math.floor(y) + dy, math.floor(x) + dx
        if yy >= 0 and yy < H and xx >= 0 and xx < W and rows_of_mask[yy + 1][xx + 1] then return true end
      end end
      return false
    end
    for _, x in ipairs{1, 3, 5, 7, 9} do
      local px, py = p:to_pixel(x, x * x)
      local sx, sy = x0 + (px - left), y1 - (bottom - py)
      assert.truthy(blue_near(sx, sy), string.format("no curve at x = %g (screen %d, %d)", x, sx, sy))
      -- and not where a straight line from the first point to the last would be
      local lx, ly = p:to_pixel(x, 10 * x)
      assert.falsy(blue_near(x0 + (lx - left), y1 - (bottom - ly)), "curve at the chord, x = " .. x)
    end
  end)
end)
