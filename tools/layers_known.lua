-- tools/layers_known.lua: the crossings of the layers that remain (tools/layers.lua fails on any
-- other, and on one of these that is gone, so that this list only shrinks).
-- core/tensor.c still holds the views and copies besides the tensor header and storage: the views
-- record their autograd node, the copies dispatch to a device's kernel, and a storage is allocated
-- through its device's backend. They move to ops/ (views and copies) and behind an allocator that
-- dispatch registers with core.
local known = {}
for _, k in ipairs{
  "core/tensor.c -> kiln_autograd_check_inplace",
  "core/tensor.c -> kiln_autograd_record",
  "core/tensor.c -> kiln_backend_for",
  "core/tensor.c -> kiln_cpu_copy",
  "core/tensor.c -> kiln_dispatch",
  "core/tensor.c -> kiln_pinned_backend",
} do known[k] = true end
return known
