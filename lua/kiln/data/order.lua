-- kiln.data.order: the order of an epoch, shuffled from (seed, epoch) by a generator of its own,
-- never kiln's global one.
local core = require "kiln.core"
local ffi, C = core.ffi, core.C
local wrap, raise, is_tensor = core.wrap, core.raise, core.is_tensor
local check_integer = core.integer_arg
local CPU = core.device("cpu")

local M = {}

-- Fisher-Yates over n 0-based int64s at p, drawn from a splitmix64 stream of (seed, epoch)
-- (C: kiln_permutation_fill, the one the C loader uses too). The same seed gives the same order
-- on every machine, and kiln's global generator is never touched.
local function shuffle(p, n, seed, epoch)
  core.check(C.kiln_permutation_fill(p, n, seed, epoch))
end

-- The order of an epoch as an i64 tensor of 0-based indices (what C's index_select takes).
local function order0(n, shuffled, seed, epoch)
  local perm = wrap(C.kiln_tensor_arange(0, n, 1, C.KILN_I64, CPU))
  if shuffled and n > 1 then shuffle(ffi.cast("int64_t *", perm.p.storage.data) + perm.p.offset, n, seed, epoch) end
  return perm
end

-- Calls without a seed draw one from kiln's initial seed and a counter: reproducible after
-- kiln.manual_seed, different on every call, and still without drawing from the global generator.
local unseeded_calls = 0
local function default_seed()
  unseeded_calls = unseeded_calls + 1
  return tonumber(C.kiln_initial_seed() % 2 ^ 52) + unseeded_calls * 1000003
end

-- permutation(n, {seed =, epoch =}): the shuffled order batches() uses, counting from 1.
function M.permutation(n, opts)
  opts = core.options(opts, core.set("seed", "epoch"), "permutation")
  check_integer(n, "permutation", "n")
  local seed = opts.seed
  if seed == nil then seed = default_seed() end
  check_integer(seed, "permutation", "seed")
  check_integer(opts.epoch or 0, "permutation", "epoch")
  local perm = order0(n, true, seed, opts.epoch or 0)
  return wrap(C.kiln_binary_scalar(C.KILN_OP_ADD, perm.p, 1, 0))
end

M.order0, M.default_seed = order0, default_seed

return M
