# Two commands (README): `make run` and `make test`. Both install missing Debian packages when run as root,
# configure and build; then `run` generates text with the embedded model and `test` runs the CPU test suite.
BUILD    ?= build/default
JOBS     ?= $(shell nproc)
DEB_PKGS := cmake ninja-build g++ pkg-config libeigen3-dev doctest-dev nlohmann-json3-dev libcli11-dev \
            libpcre2-dev libbenchmark-dev
CMAKE_ARGS ?=
PROMPT   ?= Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?

.PHONY: all deps configure build run test clean device-test

all: build

deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "installing:$$missing"; \
	    (apt-get install -y -qq $$missing >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq $$missing)) ; \
	  else echo "missing Debian packages:$$missing (run as root, or install them)"; exit 1; fi; \
	fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job needs only the command line, not the test suite: build just that target.
run: configure
	cmake --build $(BUILD) -j $(JOBS) --target ling
	$(BUILD)/examples/ling run "$(PROMPT)"

test: build
	cd $(BUILD) && ctest --output-on-failure -LE gpu -j $(JOBS) --timeout 900

device-test:
	bash scripts/device-test.sh

clean:
	rm -rf build
