# turboquant: the two commands a user needs are `make demo` and `make test`.
# Both install what is missing (Debian packages, the model, the corpus), build, and run.

BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
GEN        := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps fetch venv build demo test test-sanitize test-tsan fuzz bench clean wheel

all: build

deps:
	bash scripts/install-deps.sh

fetch: deps
	@if [ -x scripts/fetch-model.sh ]; then bash scripts/fetch-model.sh && bash scripts/fetch-model.sh gemma3-270m; fi
	@if [ -x scripts/fetch-corpus.sh ]; then bash scripts/fetch-corpus.sh; fi

# The tests' Python environment (.venv: pinned gguf, numpy, pytest; scripts/setup-venv.sh).
venv: deps
	bash scripts/setup-venv.sh

$(BUILD)/build.ninja $(BUILD)/Makefile:
	cmake -S . -B $(BUILD) $(GEN) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: fetch build
	bash scripts/demo-codec.sh $(BUILD)/tq
	@if [ -f scripts/demo.sh ]; then bash scripts/demo.sh $(BUILD)/tq; fi

# A build dir configured before the venv had nanobind lacks the Python extension (its
# TQ_BUILD_PYTHON=AUTO looks once, at configure): configure again so the pytest suite runs.
test: fetch venv build
	@if [ ! -d $(BUILD)/python ] && .venv/bin/python -c 'import nanobind' 2>/dev/null; then \
	  cmake -S . -B $(BUILD) >/dev/null && cmake --build $(BUILD) -j $(JOBS); fi
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

# The Python package as a wheel in dist/ (scikit-build-core over this CMake project, the
# library compiled into the extension; pyproject.toml pins the build requirements). For users:
# `pip install .` does the same and installs it.
wheel: deps venv
	.venv/bin/python -m pip wheel . --no-deps --disable-pip-version-check -w dist

# ASan + UBSan over the whole suite (sizes shrunk by TQ_TEST_SMALL=1, never the checks).
# allocator_may_return_null: a refused huge allocation throws std::bad_alloc as it does
# without ASan, instead of ASan aborting, so the error paths are what gets tested.
test-sanitize: fetch venv
	cmake -S . -B build-asan $(GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1" -DTQ_SANITIZE=ON -DTQ_BUILD_BENCH=OFF
	cmake --build build-asan -j $(JOBS) --target tq_tests tq
	cd build-asan && TQ_TEST_SMALL=1 ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:strict_string_checks=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) --timeout 1800

# TSan over the multi-threaded tests (attention split over KV, index search, batched
# encode, concurrent construction). Built with clang so that OpenMP is LLVM's libomp, whose
# synchronisation TSan understands through the Archer tool (libarcher, OMP_TOOL_LIBRARIES);
# GCC's libgomp is not instrumented and gives false reports.
test-tsan: fetch
	CC=clang CXX=clang++ cmake -S . -B build-tsan $(GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1" -DTQ_TSAN=ON -DTQ_BUILD_BENCH=OFF
	cmake --build build-tsan -j $(JOBS) --target tq_tests
	cd build-tsan && TQ_TEST_SMALL=1 OMP_TOOL_LIBRARIES="$$(ls /usr/lib/llvm-*/lib/libarcher.so | head -1)" \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/scripts/tsan.supp" \
	  ctest --output-on-failure -j $(JOBS) -R 'Thread|Parallel|Concurrent' --timeout 1800

# libFuzzer targets (fuzz/fuzz_*.cpp, clang + ASan + UBSan), each run FUZZ_SECONDS.
FUZZ_SECONDS ?= 180
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B build-fuzz $(GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTQ_BUILD_FUZZ=ON -DTQ_BUILD_TESTS=OFF -DTQ_BUILD_BENCH=OFF
	cmake --build build-fuzz -j $(JOBS)
	bash scripts/run-fuzz.sh build-fuzz $(FUZZ_SECONDS)

bench: build
	@echo "see BENCHMARKS.md for the commands behind every figure"

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz dist
