# trustbridge — see README.md. Every target works on a machine with only Go
# and make; tools are fetched as pinned Go modules.

GO        ?= go
BIN       := bin/trustbridge
PKG       := github.com/trustbridge/trustbridge
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
FUZZTIME  ?= 30s
# Minimizing a new interesting input is not counted as progress and, on
# large seeds, can stall a short fuzz run for a minute; cap it.
FUZZMINIMIZETIME ?= 5s
BENCHTIME ?= 1s
BENCHCOUNT ?= 6
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build test fmt-check vet tidy-check unit fuzz bench lint clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/trustbridge

# test: what CI runs. `go test` also runs every fuzz target's seed corpus
# (f.Add seeds and testdata/fuzz/) as ordinary tests.
test: fmt-check vet tidy-check build unit

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

tidy-check:
	$(GO) mod tidy -diff

unit:
	$(GO) test -race -count=1 ./...

# fuzz: every fuzz target in the module for FUZZTIME each.
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
		for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$target ($(FUZZTIME))"; \
			$(GO) test -run='^$$' -fuzz="^$$target$$" -fuzztime=$(FUZZTIME) \
				-fuzzminimizetime=$(FUZZMINIMIZETIME) $$pkg; \
		done; \
	done

# bench: benchmarks, reported as ratios against a baseline measured in the
# same run, written to BENCHMARKS.md.
bench:
	mkdir -p bin
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) ./... > bin/bench.txt || (cat bin/bench.txt; exit 1)
	$(GO) run ./internal/benchreport -in bin/bench.txt -out BENCHMARKS.md \
		-notes internal/benchreport/NOTES.md -cmd "make bench BENCHTIME=$(BENCHTIME) BENCHCOUNT=$(BENCHCOUNT)"

lint:
	$(GO) run $(STATICCHECK) ./...

clean:
	rm -rf bin
