-- kiln.plot: PNG plots decode with kiln's image reader (stb_image) and hold each series in its colour
-- where the data must be drawn; smoothing and downsampling against their definitions; the SVG's
-- curve at the same pixels; base64 against coreutils' base64; the display bundle.
local plot = require "kiln.plot"
local display = require "kiln.display"
local N = require "nb_helpers"

local function pixel(img, x, y)   -- img: u8 [3,H,W]; x, y from 0
  x, y = math.floor(x), math.floor(y)
  return {img[1][y + 1][x + 1], img[2][y + 1][x + 1], img[3][y + 1][x + 1]}
end

local function near(c, want, tol)
  return math.abs(c[1] - want[1]) <= tol and math.abs(c[2] - want[2]) <= tol and math.abs(c[3] - want[3]) <= tol
end

describe("kiln.plot", function()
  local dir
  setup(function() dir = N.tmpdir("plot") end)
  teardown(function() N.rmdir(dir) end)

  it("draws each series of a PNG line chart in its colour where the data lies", function()
    local xs, up, down = {}, {}, {}
    for i = 0, 20 do xs[#xs + 1], up[#up + 1], down[#down + 1] = i, i, 20 - i end
    local p = plot.line({{x = xs, y = up, label = "up"}, {x = xs, y = down, label = "down"}}, {title = "two lines", legend = false})
    local path = p:save(dir .. "/lines.png")
    local img = kiln.data.read_image(path, 3)
    assert.same({3, 360, 640}, {img:size(1), img:size(2), img:size(3)})
    local blue, orange = plot.colors[1], plot.colors[2]
    local hits = 0
    for _, x in ipairs{2.5, 4.5, 7.5, 13.5, 16.5} do   -- away from the crossing at 10
      assert.truthy(near(pixel(img, p:to_pixel(x, x)), blue, 40), "up at x = " .. x)
      assert.truthy(near(pixel(img, p:to_pixel(x, 20 - x)), orange, 40), "down at x = " .. x)
      -- the other series' place is background there
      local c = pixel(img, p:to_pixel(x, 10 + (x < 10 and 5 or -5)))
      assert.truthy(near(c, {255, 255, 255}, 40), "background at x = " .. x)
      hits = hits + 1
    end
    assert.equal(5, hits)
    -- the SVG draws the same polyline through the same pixels
    local svg = p:svg()
    local px, py = p:to_pixel(5, 5)
    assert.truthy(svg:find(string.format("%.2f,%.2f", px, py), 1, true))
    assert.truthy(svg:find('stroke="#1f77b4"', 1, true))
  end)

  it("puts a log axis's decades at equal distances", function()
    local p = plot.line({x = {1, 2, 3}, y = {1, 10, 100}}, {log = true})
    local _, y1 = p:to_pixel(1, 1)
    local _, y10 = p:to_pixel(1, 10)
    local _, y100 = p:to_pixel(1, 100)
    assert.near(y1 - y10, y10 - y100, 1e-9)
    local img = p:raster()
    assert.truthy(near(pixel(img, p:to_pixel(1.5, 10 ^ 0.5)), plot.colors[1], 40))
  end)

  it("smooths with the debiased exponential moving average, the raw curve drawn faintly", function()
    local ys = {1, 3, 2, 5, 4}
    local w, s, ref = 0.6, 0, {}
    for i, y in ipairs(ys) do s = w * s + (1 - w) * y ref[i] = s / (1 - w ^ i) end
    local got = plot.smooth(ys, w)
    for i = 1, #ys do assert.near(ref[i], got[i], 1e-12) end
    local p = plot.line({y = ys}, {smooth = w})
    local faint, strong = 0, 0
    for _, it in ipairs(p.items) do
      if it.kind == "line" then if (it.alpha or 1) < 1 then faint = faint + 1 else strong = strong + 1 end end
    end
    assert.same({1, 1}, {faint, strong})
  end)

  it("downsamples long series keeping each bucket's minimum and maximum", function()
    local xs, ys = {}, {}
    for i = 1, 100000 do xs[i], ys[i] = i, math.sin(i / 1000) end
    ys[54321] = 50
    ys[77777] = -40
    local dx, dy = plot.downsample(xs, ys, 1000)
    assert.truthy(#dx <= 1000 and #dx >= 900, #dx)
    local top, bottom, at = -math.huge, math.huge, nil
    for i = 1, #dy do
      if dy[i] > top then top, at = dy[i], dx[i] end
      bottom = math.min(bottom, dy[i])
      if i > 1 then assert.truthy(dx[i] > dx[i - 1]) end
    end
    assert.same({50, 54321, -40}, {top, at, bottom})
    -- and the spike is drawn
    local p = plot.line({x = xs, y = ys})
    local img = p:raster()
    assert.truthy(near(pixel(img, p:to_pixel(54321, 45)), plot.colors[1], 60))
  end)

  it("overlays runs of the metrics logger's JSON lines", function()
    for r, scale in ipairs{1, 2} do
      local log = kiln.ui.metrics(dir .. "/run" .. r .. ".jsonl", {mode = "w"})
      for step = 1, 50 do log:log{step = step, loss = scale * 10 / step, lr = 0.1} end
      log:close()
    end
    local p = plot.metrics({a = dir .. "/run1.jsonl", b = dir .. "/run2.jsonl"}, {y = "loss"})
    local img = p:raster()
    assert.truthy(near(pixel(img, p:to_pixel(25, 10 / 25)), plot.colors[1], 60))
    assert.truthy(near(pixel(img, p:to_pixel(25, 20 / 25)), plot.colors[2], 60))
    local ok, err = pcall(plot.metrics, dir .. "/run1.jsonl", {y = "accuracy"})
    assert.is_false(ok)
    assert.truthy(err:find("kiln.plot.metrics: no rows hold accuracy", 1, true), err)
  end)

  it("draws scatter points in their group's colour", function()
    local p = plot.scatter({1, 2, 3}, {3, 1, 2}, {groups = {1, 2, 3}, size = 4})
    local img = p:raster()
    for i, xy in ipairs{{1, 3}, {2, 1}, {3, 2}} do
      assert.truthy(near(pixel(img, p:to_pixel(xy[1], xy[2])), plot.colors[i], 50), "point " .. i)
    end
    assert.truthy(near(pixel(img, p:to_pixel(1, 1)), {255, 255, 255}, 30))
  end)

  it("counts a histogram's bins, and draws a confusion matrix darkest at its largest count", function()
    local values = {}
    for i = 1, 1000 do values[i] = (i % 10) + 0.5 end   -- 100 in each of 10 unit bins
    local h = plot.histogram(values, {bins = 10})
    for b = 1, 10 do assert.equal(100, h.counts[b]) end
    local c = plot.confusion(kiln.tensor{{9, 1}, {2, 30}}, {classes = {"a", "b"}})
    local img = c:raster()
    local g = c.grid
    local function cell(i, j) return pixel(img, g.left + (j - 0.5) * g.cell + 0.3 * g.cell, g.top + (i - 0.5) * g.cell - 0.3 * g.cell) end
    local big, small = cell(2, 2), cell(1, 2)
    assert.truthy(big[1] + big[2] + big[3] < small[1] + small[2] + small[3])
    assert.truthy(near(big, {8, 48, 107}, 3))
  end)

  it("lays out a batch of images in a grid, pixel for pixel", function()
    local batch = kiln.zeros(6, 1, 4, 5, {dtype = "u8"})
    batch[3]:fill_(200)
    local p = plot.images(batch, {nrow = 3, scale = 2})
    local img = p:raster()
    local cell = p.cell
    -- image 3 is the third of the first row, image 1 the first
    assert.same({200, 200, 200}, pixel(img, cell.x + 2 * cell.w + 3, cell.y + 3))
    assert.same({0, 0, 0}, pixel(img, cell.x + 3, cell.y + 3))
    assert.truthy(p:svg():find('href="data:image/png;base64,', 1, true))
  end)

  it("renders itself as a bundle whose PNG is base64 of the PNG file", function()
    local p = plot.line({y = {3, 1, 2}})
    local b = display.bundle(p)
    assert.truthy(b["text/plain"]:find("kiln.plot", 1, true))
    assert.truthy(b["image/svg+xml"]:find("^<svg"))
    local path = p:save(dir .. "/b.png")
    local ref = N.sh("base64 -w0 " .. path)
    assert.equal(ref, b["image/png"])
    assert.equal(ref, plot.base64(N.read(path)))
  end)

  it("says what is wrong with its arguments", function()
    local cases = {
      {function() plot.line("x") end, "kiln.plot.line: expected a series"},
      {function() plot.line({x = {1, 2}, y = {1}}) end, "series 1: 2 x values for 1 y values"},
      {function() plot.line({y = {1, "a"}}) end, "y[2] is a string, not a number"},
      {function() plot.histogram({1}, {bins = 0}) end, "bins must be a whole number"},
      {function() plot.images(kiln.zeros(2, 2, 4, 4)) end, "with C 1 or 3"},
      {function() plot.confusion({{1, 2}}) end, "must be square"},
      {function() plot.line({y = {1}}):save(dir .. "/x.jpg") end, "must end in .svg or .png"},
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)

  it("answers arguments of the wrong kind with its own messages, never Lua's", function()
    local is_internal = require("helpers").lua_internal
    local odd = {0, -1, 2.5, 0 / 0, "x", true, {}, {1, 2}, {{}}, {y = "x"}, {y = {}}, print, kiln.zeros(0), kiln.randn(2, 3),
                 kiln.randn(3), kiln.zeros(2, 3, 4, 5, 6)}
    local found = {}
    for _, name in ipairs{"line", "metrics", "scatter", "histogram", "images", "confusion", "smooth", "downsample"} do
      for _, a in ipairs(odd) do
        for _, b in ipairs{false, 5, "x", {}, {bins = "x"}, {smooth = 2}, {width = 1e9}, {nrow = "x"}, {y = 3}, {groups = "x"}} do
          if b == false then b = nil end
          local ok, err = pcall(plot[name], a, b)
          if not ok and is_internal(tostring(err)) then found[#found + 1] = name .. ": " .. tostring(err) end
        end
      end
    end
    assert(#found == 0, table.concat(found, "\n", 1, math.min(#found, 20)))
  end)
end)
