# turboquant: the two commands a user needs are `make demo` and `make test`.
# Both install what is missing (Debian packages, the model, the corpus), build, and run.

BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
GEN        := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps fetch build demo test test-sanitize test-tsan fuzz bench clean

all: build

deps:
	bash scripts/install-deps.sh

fetch: deps
	@if [ -x scripts/fetch-model.sh ]; then bash scripts/fetch-model.sh; fi
	@if [ -x scripts/fetch-corpus.sh ]; then bash scripts/fetch-corpus.sh; fi

$(BUILD)/build.ninja $(BUILD)/Makefile:
	cmake -S . -B $(BUILD) $(GEN) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: fetch build
	bash scripts/demo-codec.sh $(BUILD)/tq
	@if [ -f scripts/demo.sh ]; then bash scripts/demo.sh $(BUILD)/tq; fi

test: fetch build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

test-sanitize: fetch
	cmake -S . -B build-asan $(GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTQ_SANITIZE=ON -DTQ_BUILD_BENCH=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && TQ_TEST_SMALL=1 ctest --output-on-failure -j $(JOBS) --timeout 1800

test-tsan: fetch
	cmake -S . -B build-tsan $(GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTQ_TSAN=ON -DTQ_BUILD_BENCH=OFF
	cmake --build build-tsan -j $(JOBS) --target tq_tests
	cd build-tsan && TQ_TEST_SMALL=1 ctest --output-on-failure -j $(JOBS) -R 'Thread|Parallel' --timeout 1800

FUZZ_SECONDS ?= 180
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B build-fuzz $(GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTQ_BUILD_FUZZ=ON -DTQ_BUILD_TESTS=OFF -DTQ_BUILD_BENCH=OFF
	cmake --build build-fuzz -j $(JOBS)
	bash scripts/run-fuzz.sh build-fuzz $(FUZZ_SECONDS)

bench: build
	@echo "see BENCHMARKS.md for the commands behind every figure"

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
