# The two commands of the README, and the steps behind them.
#   make demo   the main job
#   make test   every test: C tests (also under ASan/UBSan), Lua specs, the REPL driven through tmux
BUILD ?= build
BUILD_ASAN ?= build-asan
JOBS ?= $(shell nproc)

.PHONY: all deps configure build demo test test-c test-lua test-asan test-repl bench install clean

all: build

deps:
	@sh scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/bin/kiln examples/fashion_mnist.lua

test: build test-asan
	ctest --test-dir $(BUILD) --output-on-failure
	sh tests/repl/tmux_check.sh $(BUILD)/bin/kiln

test-c: build
	ctest --test-dir $(BUILD) --output-on-failure -L c

test-lua: build
	$(BUILD)/bin/kiln tests/lua/run.lua tests/lua

# The C tests again, built with AddressSanitizer and UndefinedBehaviorSanitizer.
test-asan: deps
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_NATIVE=ON >/dev/null
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(BUILD_ASAN) --output-on-failure -L c

test-repl: build
	sh tests/repl/tmux_check.sh $(BUILD)/bin/kiln

bench: build
	$(BUILD)/bin/kiln bench/ops.lua

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN)
