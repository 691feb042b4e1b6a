-- kiln.data: files to tensors (read_idx, read_image), datasets (tensors sharing their first dim,
-- image folders), minibatches in a seeded order that never touches kiln's global generator, and
-- the DataLoader, whose C worker threads decode, transform and collate batches ahead of the loop.
--   local x, y = fashion_mnist.load{split = "train"}
--   for epoch = 1, 10 do
--     for i, xb, yb in data.batches({x, y}, {batch_size = 64, seed = 1, epoch = epoch}) do ... end
--   end
--   local loader = data.DataLoader{dataset = data.TensorDataset(x, y), batch_size = 64, shuffle = true,
--                                  seed = 1, workers = 2}
--   for epoch = 1, 10 do for xb, yb in loader:epoch(epoch) do ... end end
-- The parts, one job each: kiln.data.files, datasets, order, batches, transforms, loader.
local files = require "kiln.data.files"
local datasets = require "kiln.data.datasets"
local order = require "kiln.data.order"
local batches = require "kiln.data.batches"
local transforms = require "kiln.data.transforms"
local loader = require "kiln.data.loader"

local data = {}
data.read_idx, data.read_image, data.write_png = files.read_idx, files.read_image, files.write_png
data.TensorDataset, data.ImageFolder = datasets.TensorDataset, datasets.ImageFolder
data.permutation = order.permutation
data.batches, data.num_batches = batches.batches, batches.num_batches
data.transforms = transforms
data.transform_pipeline = transforms.pipeline
data.DataLoader = loader.DataLoader

return data
