# The two commands of the README, and the steps behind them.
#   make demo   the main job
#   make test   every test: C tests (also under ASan/UBSan), Lua specs, the REPL driven through tmux,
#               and the file readers fuzzed briefly (make fuzz)
BUILD ?= build
BUILD_ASAN ?= build-asan
BUILD_FUZZ ?= build-fuzz
FUZZ_SECONDS ?= 10
JOBS ?= $(shell nproc)

.PHONY: all deps deps-test configure build demo test test-c test-lua test-asan test-repl fuzz bench install clean

all: build

deps:
	@sh scripts/install-deps.sh

deps-test:
	@sh scripts/install-deps.sh --test

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/bin/kiln examples/fashion_mnist.lua

test: deps-test build test-asan
	ctest --test-dir $(BUILD) --output-on-failure
	sh tests/repl/tmux_check.sh $(BUILD)/bin/kiln
	$(MAKE) fuzz

test-c: build
	ctest --test-dir $(BUILD) --output-on-failure -L c

test-lua: build
	$(BUILD)/bin/kiln tests/lua/run.lua tests/lua

# The C tests again, built with AddressSanitizer and UndefinedBehaviorSanitizer, then the Lua specs
# on that build (LuaJIT's own allocations are not leak-checked; an allocation larger than memory
# is an error kiln reports, so ASan returns NULL for it as malloc does).
test-asan: deps
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_NATIVE=ON >/dev/null
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(BUILD_ASAN) --output-on-failure -L c
	ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(BUILD_ASAN)/bin/kiln tests/lua/run.lua tests/lua

# libFuzzer on the safetensors, IDX and image readers (clang, ASan), FUZZ_SECONDS each, from the seed
# corpus in tests/fuzz/corpus (new inputs go to $(BUILD_FUZZ)/corpus, never into the tree).
fuzz: deps
	cmake -S . -B $(BUILD_FUZZ) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON -DKILN_CUDA=OFF >/dev/null
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz_safetensors fuzz_idx fuzz_image
	for r in safetensors idx image; do \
	  mkdir -p $(BUILD_FUZZ)/corpus/$$r; \
	  if $(BUILD_FUZZ)/bin/fuzz_$$r -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=$(BUILD_FUZZ)/ \
	       $(BUILD_FUZZ)/corpus/$$r tests/fuzz/corpus/$$r > $(BUILD_FUZZ)/fuzz_$$r.log 2>&1; then \
	    echo "fuzz_$$r: $$(grep -o 'Done [0-9]* runs in [0-9]* second(s)' $(BUILD_FUZZ)/fuzz_$$r.log), no finding"; \
	  else tail -40 $(BUILD_FUZZ)/fuzz_$$r.log; echo "fuzz_$$r: a finding (input saved in $(BUILD_FUZZ)/)"; exit 1; fi; \
	done

test-repl: build
	sh tests/repl/tmux_check.sh $(BUILD)/bin/kiln

bench: build
	$(BUILD)/bin/kiln bench/ops.lua
	$(BUILD)/bin/kiln bench/kernels.lua
	$(BUILD)/bin/kiln bench/train_step.lua
	$(BUILD)/bin/kiln bench/loader.lua
	$(BUILD)/bin/kiln bench/rnn.lua
	$(BUILD)/bin/kiln bench/dist.lua

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
