#!/bin/sh
# tools/nb_fixtures.sh: writes tests/fixtures/nb/percent.ipynb, jupytext's own reading of the cell
# script tests/fixtures/nb/percent.lua, which tests/lua/nb_cells_spec.lua holds kiln's parser to.
# jupytext is not packaged by Debian 12: run this in a virtual environment that has it
# (python3 -m venv /tmp/jt && /tmp/jt/bin/pip install jupytext && PATH=/tmp/jt/bin:$PATH sh tools/nb_fixtures.sh).
set -e
cd "$(dirname "$0")/../tests/fixtures/nb"
jupytext --to ipynb --output percent.ipynb percent.lua
