-- tools/layers_known.lua: crossings of the layers that are known and not yet undone, as
-- "file -> symbol" or "file -> #include name" (tools/layers.lua fails on any other crossing, and
-- on one listed here that no longer happens, so that this list only shrinks). None remain.
return {}
