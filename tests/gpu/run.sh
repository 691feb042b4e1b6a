#!/bin/bash
# tests/gpu/run.sh: everything CUDA in one run, on a machine with a GPU (the H200): build kiln with
# its CUDA backend, check every CUDA kernel against the CPU (ops_spec.lua), run the CUDA specs
# (C loader test, pinned memory and the DataLoader on cuda, busted kiln.cuda spec, the PyTorch
# fixture specs on cuda), train the main job's CNN for 20 steps on the CPU and on cuda and compare
# the losses (train_check.lua), and benchmark GEMM (bench_gemm.lua), conv2d (bench_conv.lua) and
# training steps of the CNN and of ResNet-18 (bench_train.lua), each with PyTorch on the same
# shapes when it can be imported. Results, logs and a summary go to $OUT (default build-gpu/results). Meant to finish
# in under 7 minutes. Without a GPU: "skipped: no CUDA device"
# (KILN_GPU_RUN_ANYWAY=1: build and run anyway, each GPU check then skipping itself).
# LuaJIT, OpenBLAS, busted and the rest come from shared/gpu-deps/ (made by tests/gpu/prepare.sh on
# a build machine) unless this machine has them itself. See tests/gpu/README.md.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
RESULTS=${OUT:-$ROOT/build-gpu/results}
mkdir -p "$RESULTS"
export OUT=$RESULTS
exec > >(tee "$RESULTS/run.log") 2>&1
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START ))s; }
STATUS=0
step() { echo; echo "== $* ($(elapsed))"; }
fail() { echo "FAILED: $*"; STATUS=1; }

# ---- a GPU? (KILN_GPU_RUN_ANYWAY=1 goes on without one: a check of this script on a build machine) ----
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } && [ ! -e /dev/nvidia0 ] &&
   [ "${KILN_GPU_RUN_ANYWAY:-0}" != 1 ]; then
  echo "skipped: no CUDA device"
  exit 0
fi
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null || true
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$NVCC" --version | tail -n 2
cmake --version | head -n 1
echo "cores: $(nproc)"
# PyTorch with CUDA for the ratios, asked once (importing torch takes seconds).
TORCH=no
command -v python3 >/dev/null && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && TORCH=yes
echo "PyTorch with CUDA (for the ratios): $TORCH"

# ---- dependencies ----
step "dependencies"
DEPS=${KILN_GPU_DEPS:-$ROOT/shared/gpu-deps}
CMAKE_DEPS=()
RUN_ENV=()
if command -v luajit >/dev/null && pkg-config --exists luajit 2>/dev/null && [ -z "${KILN_GPU_DEPS:-}" ] &&
   [ ! -d "$DEPS" ]; then
  echo "using this machine's LuaJIT, OpenBLAS and busted"
else
  if [ ! -d "$DEPS/usr" ]; then
    echo "no $DEPS: run 'sh tests/gpu/prepare.sh' on a build machine first and copy the folder along"
    exit 2
  fi
  echo "using $DEPS ($(wc -l < "$DEPS/PACKAGES") packages)"
  # Links the copy may have dropped, made again from the list prepare.sh wrote.
  if [ -f "$DEPS/LINKS" ]; then
    while read -r link target; do
      [ -e "$DEPS/$link" ] || [ -L "$DEPS/$link" ] || ln -s "$target" "$DEPS/$link" 2>/dev/null
    done < "$DEPS/LINKS"
  fi
  ARCH=x86_64-linux-gnu
  LIBS="$DEPS/usr/lib/$ARCH:$DEPS/lib/$ARCH:$DEPS/usr/lib/$ARCH/openblas-pthread"
  # Tools from the folder run with its libraries; nothing else does (the machine's own cmake,
  # compilers and Python keep theirs).
  TOOLS=$ROOT/build-gpu/deps-bin
  mkdir -p "$TOOLS"
  for tool in pkgconf luajit; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' "$LIBS" \
      "$DEPS/usr/bin/$tool" > "$TOOLS/$tool"
    chmod +x "$TOOLS/$tool"
  done
  ln -sf pkgconf "$TOOLS/pkg-config"
  export PATH=$TOOLS:$PATH
  export PKG_CONFIG_LIBDIR="$DEPS/usr/lib/$ARCH/pkgconfig:$DEPS/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR=$DEPS
  export C_INCLUDE_PATH="$DEPS/usr/include:$DEPS/usr/include/$ARCH${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
  CMAKE_DEPS=(-DPKG_CONFIG_EXECUTABLE="$TOOLS/pkgconf" -DLUAJIT_EXE="$TOOLS/luajit"
              -DOPENBLAS_INCLUDE="$DEPS/usr/include/$ARCH/openblas-pthread"
              -DOPENBLAS_LIB="$DEPS/usr/lib/$ARCH/openblas-pthread/libopenblas.so"
              -DREADLINE_LIB="$DEPS/usr/lib/$ARCH/libreadline.so" -DZLIB_ROOT="$DEPS/usr"
              -DZLIB_LIBRARY="$DEPS/usr/lib/$ARCH/libz.so" -DZLIB_INCLUDE_DIR="$DEPS/usr/include"
              "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$LIBS" "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,$LIBS"
              "-DCMAKE_MODULE_LINKER_FLAGS=-Wl,-rpath-link,$LIBS")
  RUN_ENV=("LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
           "LUA_PATH=$DEPS/usr/share/lua/5.1/?.lua;$DEPS/usr/share/lua/5.1/?/init.lua;;"
           "LUA_CPATH=$DEPS/usr/lib/$ARCH/lua/5.1/?.so;;")
fi
# cuBLAS from PyTorch's wheels when the toolkit lacks it: CUDA 13's wheels keep it with the other
# toolkit libraries in nvidia/cu13, CUDA 12's in nvidia/cublas.
CUDA_LIB=$(dirname "$(dirname "$NVCC")")/lib64
if [ ! -e "$CUDA_LIB/libcublas.so" ] && command -v python3 >/dev/null; then
  NV=
  NV_ROOT=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)
  for d in "$NV_ROOT/cu13" "$NV_ROOT/cublas"; do
    if [ -n "$NV_ROOT" ] && [ -e "$d/lib/libcublas.so.13" ]; then NV=$d; break; fi
  done
  if [ -n "$NV" ]; then
    echo "cuBLAS from PyTorch: $NV"
    CMAKE_DEPS+=(-DCUDA_cublas_LIBRARY="$NV/lib/libcublas.so.13" -DCUDA_cublasLt_LIBRARY="$NV/lib/libcublasLt.so.13")
    export CPLUS_INCLUDE_PATH="$NV/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
    RUN_ENV+=("LD_LIBRARY_PATH=$NV/lib:${LIBS:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  fi
fi
# cuDNN (conv2d) from PyTorch's wheels when the toolkit lacks it; its libcudnn.so.9 finds the
# engine libraries beside itself. Without either, the build says so and conv2d stays CPU-only.
CUDA_ROOT=$(dirname "$CUDA_LIB")
if [ ! -e "$CUDA_LIB/libcudnn.so.9" ] && [ ! -e "$CUDA_ROOT/lib/libcudnn.so.9" ] && command -v python3 >/dev/null; then
  DNN=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$DNN" ] && [ -e "$DNN/lib/libcudnn.so.9" ]; then
    echo "cuDNN from PyTorch: $DNN"
    CMAKE_DEPS+=(-DCUDNN_INCLUDE_DIR="$DNN/include" -DCUDNN_LIBRARY="$DNN/lib/libcudnn.so.9")
    RUN_ENV+=("LD_LIBRARY_PATH=$DNN/lib:${NV:+$NV/lib:}${LIBS:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  fi
fi
# NCCL (libkiln_nccl.so: collectives of CUDA tensors) from PyTorch's wheels when the toolkit lacks it.
if [ ! -e "$CUDA_LIB/libnccl.so" ] && [ ! -e "$CUDA_ROOT/lib/libnccl.so" ] && command -v python3 >/dev/null; then
  NCCL=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$NCCL" ] && [ -e "$NCCL/lib/libnccl.so.2" ] && [ -e "$NCCL/include/nccl.h" ]; then
    echo "NCCL from PyTorch: $NCCL"
    CMAKE_DEPS+=(-DNCCL_INCLUDE_DIR="$NCCL/include" -DNCCL_LIBRARY="$NCCL/lib/libnccl.so.2")
    RUN_ENV+=("LD_LIBRARY_PATH=$NCCL/lib:${DNN:+$DNN/lib:}${NV:+$NV/lib:}${LIBS:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  fi
fi
run() { env ${RUN_ENV[@]+"${RUN_ENV[@]}"} "$@"; }

# ---- build ----
step "build (sm_90)"
BUILD=$ROOT/build-gpu
# Warnings are not errors here (CI has them as errors with Debian 12's compilers; this machine's
# host compiler may warn where those do not): they are counted below instead.
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_CUDA_ARCHS=90-real -DKILN_CUDA_WERROR=OFF \
     ${CMAKE_DEPS[@]+"${CMAKE_DEPS[@]}"} \
     > "$RESULTS/configure.log" 2>&1; then
  tail -n 30 "$RESULTS/configure.log"
  fail "configure"
  exit 1
fi
grep -E "CUDA compiler|Found CUDAToolkit|without the CUDA backend|kiln: cuDNN" "$RESULTS/configure.log"
# only what the checks below run (no fuzzers, no host-side CUDA tests: CI runs those)
if ! cmake --build "$BUILD" -j "$(nproc)" --target kiln kiln_cuda kiln-launcher test_cuda_loader test_pinned \
     > "$RESULTS/build.log" 2>&1; then
  grep -E "error|Error" "$RESULTS/build.log" | head -n 40
  fail "build"
  exit 1
fi
WARNINGS=$(grep -c "warning" "$RESULTS/build.log" || true)
echo "build: $WARNINGS warning line(s) (build.log)"
ls -la "$BUILD/lib"
KILN=$BUILD/bin/kiln

# ---- checks ----
step "the CUDA loader and devices"
run "$BUILD/bin/test_cuda_loader" || fail "test_cuda_loader"
run "$KILN" -e 'print("kiln.cuda: " .. kiln.cuda.device_count() .. " device(s); " .. tostring(kiln.cuda.unavailable_reason() or "available"))' ||
  fail "kiln -e"

step "every CUDA op against the CPU (tests/gpu/ops_spec.lua, fresh blocks poisoned)"
OPS_OK=yes
run KILN_CUDA_POISON=1 timeout 240 "$KILN" tests/gpu/ops_spec.lua || { fail "ops_spec.lua"; OPS_OK=no; }
if [ "$OPS_OK" = no ]; then
  # a failure above: again with every launch synchronous, so that a fault is reported at its op
  step "the same with KILN_SYNC=1 (a fault reported at its op), errors only"
  run KILN_SYNC=1 KILN_GPU_OPS_OUT=ops_sync timeout 240 "$KILN" tests/gpu/ops_spec.lua > "$RESULTS/ops_sync.log" 2>&1 ||
    tail -n 20 "$RESULTS/ops_sync.log"
fi

step "pinned memory, uploads that do not wait, the DataLoader on cuda (tests/gpu/pinned_spec.lua, test_pinned)"
run timeout 60 "$BUILD/bin/test_pinned" || fail "test_pinned"
run timeout 90 "$KILN" tests/gpu/pinned_spec.lua || fail "pinned_spec.lua"

step "streams and events: side streams, ordering, record_stream, timing (tests/gpu/streams_spec.lua)"
run timeout 90 "$KILN" tests/gpu/streams_spec.lua || fail "streams_spec.lua"

step "mixed precision: bf16 and f16 convolutions, autocast, GradScaler (tests/gpu/amp_spec.lua)"
run timeout 90 "$KILN" tests/gpu/amp_spec.lua || fail "amp_spec.lua"

step "busted: tests/lua/cuda_spec.lua"
run KILN_EXPECT_CUDA_BACKEND=1 timeout 60 "$KILN" tests/lua/run.lua tests/lua/cuda_spec.lua || fail "cuda_spec.lua"

step "kiln on cuda against PyTorch's values (tests/lua/torch_fixture_spec.lua, torch_nn_fixture_spec.lua)"
run KILN_FIXTURE_DEVICE=cuda timeout 60 "$KILN" tests/lua/run.lua tests/lua/torch_fixture_spec.lua || fail "torch_fixture_spec.lua on cuda"
run KILN_FIXTURE_DEVICE=cuda timeout 60 "$KILN" tests/lua/run.lua tests/lua/torch_nn_fixture_spec.lua || fail "torch_nn_fixture_spec.lua on cuda"

step "training: the main job's CNN, 20 steps on the CPU and on cuda, the losses compared (tests/gpu/train_check.lua)"
# Fashion-MNIST from the dependencies' folder when it holds the dataset, else the Debian package's
# folder, else a synthetic stream (train_check.txt says which).
rm -f "$RESULTS/train_check.txt"
TRAIN_DATA=()
[ -d "$DEPS/usr/share/datasets/fashion-mnist" ] && TRAIN_DATA=(--root "$DEPS/usr/share/datasets/fashion-mnist")
run timeout 120 "$KILN" tests/gpu/train_check.lua ${TRAIN_DATA[@]+"${TRAIN_DATA[@]}"} || fail "train_check.lua"

step "distributed: a one-rank NCCL group, every collective and dtype, DataParallel on cuda (tests/gpu/dist_nccl.lua)"
if [ -e "$BUILD/lib/libkiln_nccl.so" ]; then
  run timeout 120 "$KILN" tests/gpu/dist_nccl.lua || fail "dist_nccl.lua"
else
  echo "skipped: no libkiln_nccl.so in this build (NCCL not found)"
fi

# ---- benchmarks ----
step "GEMM (kiln)"
rm -f "$RESULTS/bench_gemm.jsonl"
run timeout 120 "$KILN" tests/gpu/bench_gemm.lua 4096 8192 || fail "bench_gemm.lua"
if [ "$TORCH" = yes ]; then
  step "GEMM (PyTorch, the same shapes)"
  timeout 120 python3 tests/gpu/torch_gemm.py 4096 8192 || echo "(torch_gemm.py failed; no ratio)"
fi

step "conv2d (kiln, cuDNN benchmark mode)"
rm -f "$RESULTS/bench_conv.jsonl"
run KILN_CUDNN_BENCHMARK=1 timeout 90 "$KILN" tests/gpu/bench_conv.lua || fail "bench_conv.lua"
if [ "$TORCH" = yes ]; then
  step "conv2d (PyTorch, the same shapes)"
  KILN_CUDNN_BENCHMARK=1 timeout 90 python3 tests/gpu/torch_conv.py || echo "(torch_conv.py failed; no ratio)"
fi

step "conv2d (kiln, cuDNN legacy API, benchmark mode)"
run KILN_CUDNN_API=legacy KILN_CUDNN_BENCHMARK=1 timeout 90 "$KILN" tests/gpu/bench_conv.lua || fail "bench_conv.lua (legacy API)"
grep -h "cuDNN's graph API cannot plan" "$RESULTS"/*.log 2>/dev/null && echo "(conv shapes that went to the legacy API, above)"

step "recurrent layers (kiln: cuDNN and own kernels)"
rm -f "$RESULTS/bench_rnn.jsonl"
run timeout 90 "$KILN" tests/gpu/bench_rnn.lua || fail "bench_rnn.lua"
if [ "$TORCH" = yes ]; then
  step "recurrent layers (PyTorch, the same shapes)"
  timeout 90 python3 tests/gpu/torch_rnn.py || echo "(torch_rnn.py failed; no ratio)"
fi

step "training steps: the CNN (batch 64, 28x28) and ResNet-18 (batch 64, 224x224) (kiln, cuDNN benchmark mode)"
rm -f "$RESULTS/bench_train.jsonl"
run KILN_CUDNN_BENCHMARK=1 timeout 180 "$KILN" tests/gpu/bench_train.lua || fail "bench_train.lua"
if [ "$TORCH" = yes ]; then
  step "training steps (PyTorch, the same models; the ratios)"
  timeout 120 python3 tests/gpu/torch_train.py || echo "(torch_train.py failed; no ratio)"
fi

# ---- summary ----
# The training-step table: one line per model, kiln's and PyTorch's ms per step and their ratio.
train_table() {
  command -v python3 >/dev/null || return 0
  python3 - "$1" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("bench") == "train_step" and "ms_per_step" not in r:   # the model failed: its error
        rows.setdefault(r["model"], {})["error"] = r
    elif r.get("bench") == "train_step":
        rows.setdefault(r["model"], {})["kiln" if r["impl"] == "kiln" else "torch"] = r
    elif r.get("bench") == "train_step_ratio":
        rows.setdefault(r["model"], {})["ratio"] = r
print("%-9s %6s %6s %12s %12s %7s" % ("model", "batch", "image", "kiln ms", "PyTorch ms", "ratio"))
for model, r in rows.items():
    k, t, q = r.get("kiln"), r.get("torch"), r.get("ratio")
    any_ = k or t
    if not any_:
        print("%-9s failed: %s" % (model, r["error"].get("error")))
        continue
    print("%-9s %6d %6d %12s %12s %7s%s" % (model, any_["batch"], any_["image"],
          "%.3f" % k["ms_per_step"] if k else "-", "%.3f" % t["ms_per_step"] if t else "-",
          "%.3f" % q["ratio"] if q else "-", "" if not q else ("  (target <= %.1f: %s)" % (q["target"], "met" if q["within_target"] else "NOT met"))))
PY
}
step "summary"
{
  echo "kiln GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(elapsed)"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1
  [ -f "$RESULTS/gpu_ops.txt" ] && tail -n 1 "$RESULTS/gpu_ops.txt"
  [ -f "$RESULTS/bench_gemm.jsonl" ] && cat "$RESULTS/bench_gemm.jsonl"
  [ -f "$RESULTS/bench_conv.jsonl" ] && cat "$RESULTS/bench_conv.jsonl"
  [ -f "$RESULTS/bench_rnn.jsonl" ] && cat "$RESULTS/bench_rnn.jsonl"
  [ -f "$RESULTS/train_check.txt" ] && tail -n 1 "$RESULTS/train_check.txt"
  [ -f "$RESULTS/bench_train.jsonl" ] && cat "$RESULTS/bench_train.jsonl"
  [ -f "$RESULTS/bench_train.jsonl" ] && train_table "$RESULTS/bench_train.jsonl"
  [ "$STATUS" = 0 ] && echo "status: all checks passed" || echo "status: FAILURES (see run.log)"
} | tee "$RESULTS/summary.txt"
exit $STATUS
