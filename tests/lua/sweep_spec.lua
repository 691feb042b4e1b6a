-- Every public function of kiln, kiln.functional, kiln.nn's constructors (and the modules they
-- make), kiln.optim and kiln.data, called with arguments of the wrong kind: strings, NaN, huge and
-- negative numbers, tables, booleans, functions, and tensors that are empty, 0-dim, bool,
-- non-contiguous or of another shape. Whatever a call answers, it must not be a crash (the run
-- would stop) nor a message from inside Lua ("attempt to index a nil value", "bad argument #2 to
-- 'format'") instead of one naming the op and the argument.
local kiln = require "kiln"
local F = require "kiln.functional"

local is_internal = require("helpers").lua_internal

local function tensors()
  return {kiln.randn(2, 3), kiln.randn(3), kiln.zeros(0, 3), kiln.randn(2, 3):t(), kiln.tensor(5),
          kiln.randint(1, 3, {4}), kiln.randn(2, 3, 4, 5), kiln.ones(2, 3, {dtype = "bool"}), kiln.randn(2, 3, {dtype = "f64"})}
end
local others = {0, -1, 3, 2.5, 1e18, 0 / 0, "x", true, {}, {2, 3}, {-1}, print}

-- Calls f with argument lists built from tensors and others; returns the Lua-internal messages.
local function sweep(label, f, first)
  local found, ts = {}, tensors()
  local lists = {{}}
  local heads = first and {first} or ts
  for _, a in ipairs(heads) do
    lists[#lists + 1] = {a}
    for _, s in ipairs(others) do lists[#lists + 1] = {a, s} lists[#lists + 1] = {a, 1, s} end
    for _, b in ipairs(ts) do lists[#lists + 1] = {a, b} end
  end
  for _, s in ipairs(others) do lists[#lists + 1] = {s} end
  for _, args in ipairs(lists) do
    local ok, err = pcall(f, unpack(args, 1, 3))
    if not ok and is_internal(tostring(err)) then found[#found + 1] = label .. ": " .. tostring(err) end
  end
  return found
end

local function names_of(t, keep)
  local names = {}
  for k, v in pairs(t) do if type(v) == "function" and (not keep or keep(k)) then names[#names + 1] = k end end
  table.sort(names)
  return names
end

local function assert_none(found, what, at_least, count)
  assert(count >= at_least, string.format("only %d %s swept", count, what))
  local uniq, seen = {}, {}
  for _, m in ipairs(found) do if not seen[m] then seen[m] = true uniq[#uniq + 1] = m end end
  assert(#found == 0, #found .. " Lua-internal messages:\n" .. table.concat(uniq, "\n", 1, math.min(#uniq, 40)))
end

describe("every public function with arguments of the wrong kind", function()
  -- they change state every later call sees, without an error, or print
  local skip = {help = true, set_num_threads = true, manual_seed = true, seed = true, set_rng_state = true,
                set_gc_threshold = true, empty_cache = true, set_grad_enabled = true, save = true,
                set_float32_matmul_precision = true}

  it("kiln.*", function()
    local found, names = {}, names_of(kiln, function(k) return not skip[k] end)
    for _, name in ipairs(names) do
      for _, m in ipairs(sweep("kiln." .. name, kiln[name])) do found[#found + 1] = m end
    end
    kiln.set_grad_enabled(true)
    assert_none(found, "functions", 150, #names)
  end)

  it("kiln.functional", function()
    local found, names = {}, names_of(F)
    for _, name in ipairs(names) do
      for _, m in ipairs(sweep("F." .. name, F[name])) do found[#found + 1] = m end
    end
    assert_none(found, "functions", 15, #names)
  end)

  it("kiln.nn's constructors and the modules they make", function()
    local found, names = {}, names_of(kiln.nn, function(k) return k:match("^%u") ~= nil end)
    local shapes = {{}, {3}, {3, 4}, {3, 4, 3}, {0, 4}, {-1, 4}, {"x"}, {3, "x"}, {2.5, 4}, {{}}, {3, 4, {}},
                    {3, 4, {bias = "x"}}, {3, 4, 3, {stride = 0}}, {3, 4, {num_layers = 0}}, {3, 4, {dropout = 2}}}
    for _, name in ipairs(names) do
      for _, args in ipairs(shapes) do
        local ok, m = pcall(kiln.nn[name], unpack(args, 1, 4))
        if not ok and is_internal(tostring(m)) then found[#found + 1] = "nn." .. name .. ": " .. tostring(m) end
        if ok and kiln.nn.is_module(m) then
          for _, x in ipairs(tensors()) do
            local ok2, e = pcall(m, x)
            -- a module's error names it and its input; what follows must be kiln's own message too
            if not ok2 and is_internal(tostring(e)) and kiln.is_tensor(x) then found[#found + 1] = "nn." .. name .. "(x): " .. tostring(e) end
          end
        end
      end
    end
    assert_none(found, "constructors", 30, #names)
  end)

  it("kiln.optim and kiln.data", function()
    local found = {}
    local p = kiln.randn(2, {requires_grad = true})
    for _, name in ipairs{"SGD", "Adam", "AdamW", "RMSprop", "Adagrad"} do
      for _, m in ipairs(sweep("optim." .. name, kiln.optim[name], {p})) do found[#found + 1] = m end
    end
    local data_names = {"read_image", "write_png", "permutation", "read_idx", "ImageFolder", "TensorDataset", "num_batches",
                        "batches", "DataLoader"}
    for _, name in ipairs(data_names) do
      for _, m in ipairs(sweep("data." .. name, kiln.data[name])) do found[#found + 1] = m end
    end
    assert_none(found, "functions", 14, 5 + #data_names)
  end)
end)
