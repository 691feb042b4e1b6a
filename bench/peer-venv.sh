#!/bin/sh
# Makes bench/.venv: PyTorch as a user installs it today (pip install torch, from PyPI: MKL and
# oneDNN on the CPU), the peer the benchmarks measure kiln against in the same run. Tests never
# need it. usage: sh bench/peer-venv.sh [torch version spec, default: the newest]
# The benchmarks use bench/.venv/bin/python when it exists (KILN_PEER_PYTHON overrides it), else
# Debian's /usr/bin/python3 with python3-torch.
set -e
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet "torch${1:+==$1}" numpy
.venv/bin/python -c 'import torch; print("bench/.venv: torch", torch.__version__, torch.__config__.parallel_info().splitlines()[0])'
