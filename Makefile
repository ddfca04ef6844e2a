# trustbridge — see README.md. Every target works on a machine with only Go
# and make; tools are fetched as pinned Go modules.

GO        ?= go
BIN       := bin/trustbridge
PKG       := github.com/trustbridge/trustbridge
# Evaluated once (a recursive ?= ran git at each use: a commit during a
# long make gave the image's binary and its label two versions).
ifeq ($(origin VERSION),undefined)
VERSION   := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
endif
export VERSION
LDFLAGS   := -s -w -X main.version=$(VERSION)
FUZZTIME  ?= 1m
# Minimizing a new interesting input is not counted as progress and, on
# large seeds, can stall a short fuzz run for a minute; cap it.
FUZZMINIMIZETIME ?= 5s
BENCHTIME ?= 1s
BENCHCOUNT ?= 6
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build run demo test fmt-check vet tidy-check unit istio-tests istio-tests-short vault-tests helm-tests image image-tests fuzz bench bench-istio lint proto clean kube-tools spire-tools ui-tools ui-screenshot hsm-tools build-pkcs11 shape

all: build

# A static binary (no cgo: trustbridge has no C code, and the pure-Go
# resolver and user lookup need no libc), the one make image puts in the
# image; on Linux the two builds share every compiled package.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/trustbridge

# build-pkcs11: the same binary with cgo, for --key-manager pkcs11 (CA keys
# in an HSM): PKCS#11 modules are C libraries it loads at run time. Needs a
# C compiler; dynamically linked against libc (docs/key-managers.md).
build-pkcs11:
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/trustbridge-pkcs11 ./cmd/trustbridge

# run: the server on an embedded default: trust domain example.org, state
# in ./data, self-signed CA, no Kubernetes, bundle endpoint (https_spiffe)
# on loopback port 8443, certificate service (gRPC) on loopback port 15012.
# Ctrl-C stops it; a second run reuses ./data (--init creates it and its CA
# on the first run only; without it a missing --data-dir is refused).
# The admin API is also on ./data/admin.sock (0600): bin/trustbridge
# federation add|remove, bundle set, log level ... run from here need no
# --admin and no token.
RUN_ARGS ?=
run: build
	$(BIN) server --trust-domain example.org --data-dir ./data --init --bundle-listen 127.0.0.1:8443 --grpc-listen 127.0.0.1:15012 $(RUN_ARGS)

# demo: east.example and west.example federating on this machine (one
# https_spiffe, one https_web), a workload certificate in each, mTLS between
# them, and a third trust domain refused; every step printed, everything
# removed at the end. DEMO_ARGS=-keep leaves the servers up until Ctrl-C.
DEMO_ARGS ?=
demo: build
	$(GO) run ./cmd/trustbridge-demo -bin $(BIN) $(DEMO_ARGS)

# test: what CI runs. `go test` also runs every fuzz target's seed corpus
# (f.Add seeds and testdata/fuzz/) as ordinary tests. Each phase runs as a
# make of its own and says how long it took, with a summary at the end
# (CI's budget on a fresh machine is 45 minutes; see .ci/run).
TEST_PHASES := fmt-check vet tidy-check build kube-tools spire-tools ui-tools hsm-tools unit istio-tests-short vault-tests helm-tests image-tests
test:
	@set -e; summary=; for p in $(TEST_PHASES); do \
		start=$$(date +%s); echo "::: phase $$p"; \
		$(MAKE) --no-print-directory $$p; \
		took=$$(( $$(date +%s) - start )); echo "::: phase $$p took $${took}s"; \
		summary="$$summary  $$p $${took}s\n"; \
	done; printf "::: make test phases:\n$$summary"

fmt-check:
	@out=$$(find . -name '*.go' -not -path './bin/*' -not -path './.git/*' -print0 | xargs -0 gofmt -l); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# vet with unit's $(RACE) (defined below): vet compiles every dependency
# for its export data, and compiled the same way they are exactly what
# `go test -race` needs next, instead of a second, plain build of all of
# them (on a fresh machine that second build was several CPU-minutes).
vet:
	$(GO) vet $(RACE) ./...

tidy-check:
	$(GO) mod tidy -diff

# The race detector needs cgo and a C compiler. Where there is none, the
# tests still run, without it, and say so.
RACE := $(shell [ "$$($(GO) env CGO_ENABLED)" = 1 ] && command -v "$$($(GO) env CC)" >/dev/null 2>&1 && echo -race)

# The Kubernetes tier (internal/testkit/kubetest) runs against a real kube-apiserver
# and etcd from bin/kube, the SPIRE tier (internal/testkit/spiretest) against a real
# spire-server from bin/spire, the status page's browser tests
# (internal/server/statusui) against headless Chromium; under make test a missing
# one fails the run instead of skipping it. The PKCS#11 tier (ca/pkcs11,
# internal/testkit/hsmtest) runs against SoftHSM2 from hsm-tools, likewise required.
# PKCS#11 needs cgo, as -race does: without a C compiler the SoftHSM2
# tests skip (and say so) instead of failing. TRUSTBRIDGE_BIN is
# bin/trustbridge, without the race detector, for tests that measure the
# server in a process of its own (its memory under a connection flood).
HSM_TESTS := $(if $(RACE),require,)
unit: build kube-tools spire-tools ui-tools hsm-tools
	@[ -n "$(RACE)" ] || echo "note: no C compiler for cgo; running tests without -race (apt-get install gcc to enable it)"
	TRUSTBRIDGE_BIN=$(CURDIR)/$(BIN) TRUSTBRIDGE_HSM_TESTS=$(HSM_TESTS) TRUSTBRIDGE_UI_TESTS=require TRUSTBRIDGE_KUBE_TESTS=require TRUSTBRIDGE_SPIRE_TESTS=require KUBEBUILDER_ASSETS=$(CURDIR)/$(KUBE_DIR) $(GO) test $(RACE) -count=1 ./...

# istio-tests: Istio's own agent code (its citadel CA client, the
# SecretManagerClient cache and its SDS server, from the istio.io/istio module
# pinned in internal/testkit/istiotest, a module of its own) against bin/trustbridge:
# the ROOTCA a sidecar would hand Envoy holds every local root before, during
# and after a root rotation, and an Envoy-like SDS client gets certificates
# renewed at the grace ratio across one. The phase after activation waits 5
# refresh hints (the server's minimum is 1m), so the whole run takes about 6
# minutes; istio-tests-short, part of make test, stops the root-bundle test
# after the phase during rotation (about 70s warm; add about 40s with cold
# module and build caches). The full run also builds the tests tagged
# istioauthz: Istio's RBAC generator matching the guide's federated
# principals, which compiles about a thousand of istiod's packages (three
# minutes cold), so the short run leaves them out.
ISTIO_TESTFLAGS ?= -tags istioauthz
istio-tests: build
	cd internal/testkit/istiotest && TRUSTBRIDGE_BIN=$(CURDIR)/$(BIN) TRUSTBRIDGE_ISTIO_TESTS=require $(GO) test -count=1 $(ISTIO_TESTFLAGS) ./...

istio-tests-short: build
	$(MAKE) --no-print-directory istio-tests ISTIO_TESTFLAGS=-short

# vault-tests: HashiCorp Vault's JWT auth method (vault-plugin-auth-jwt, the
# backend of Vault's auth/jwt mount, pinned in internal/testkit/vaulttest, a
# module of its own) in process against bin/trustbridge: the server runs
# with --jwt-issuer and an https_web bundle endpoint serving the issuer's
# OIDC discovery document and JWKS, and Vault, configured by
# oidc_discovery_url and by jwks_url with bound_issuer, logs in a JWT-SVID
# from `trustbridge jwt mint` as its SPIFFE ID, refusing it for a role bound
# to another SPIFFE ID or when it is for another audience; once per
# --jwt-key-type (ES256, ES384, RS256). About 6s warm;
# with an empty build cache, compiling Vault's SDK and the plugin's
# dependencies (about 680 packages) takes about 2 minutes (110 s on 2 cores;
# 155 s with an empty module cache too).
vault-tests: build
	cd internal/testkit/vaulttest && TRUSTBRIDGE_BIN=$(CURDIR)/$(BIN) TRUSTBRIDGE_VAULT_TESTS=require $(GO) test -count=1 ./...

# helm-tests: the Helm chart (deploy/helm/trustbridge) rendered by Helm's own
# Go packages (helm.sh/helm/v3, pinned in deploy/helm/test, a module of its
# own): equal to deploy/base with default values, every value landing on a
# server flag that bin/trustbridge's `config check` accepts, bad values
# refused, every rendering through `kubectl apply --dry-run=server` against
# the real API server tier. About 10s warm. Built with unit's $(RACE), so
# that client-go, envtest and the rest it shares with the main module's
# tests come from the build cache: after unit, a cold build of it adds about
# a minute (3.5 minutes from an empty cache).
helm-tests: build kube-tools
	cd deploy/helm/test && TRUSTBRIDGE_BIN=$(CURDIR)/$(BIN) TRUSTBRIDGE_KUBE_TESTS=require KUBEBUILDER_ASSETS=$(CURDIR)/$(KUBE_DIR) $(GO) test $(RACE) -count=1 ./...

# image: the container image, without a container engine or network: a
# static bin/image/trustbridge (CGO_ENABLED=0, GOOS=linux: the same build
# as make build's on Linux, so only a link more) on an empty base with a
# nonroot /etc/passwd (uid 65532) and no CA file (the binary links Mozilla's
# roots, pinned in go.mod, for where the system has none; CA_CERTS=FILE adds
# a bundle of your own, which replaces them), written by deploy/image (a module of its
# own, go-containerregistry) as an OCI image layout archive, reproducible from
# the commit: docker load -i bin/trustbridge-image.tar (or podman load,
# skopeo copy oci-archive:bin/trustbridge-image.tar docker://REGISTRY/...).
# image-tests reads it back and runs its binary; deploy/image's own tests check
# the builder and that deploy/Dockerfile makes the same user and entrypoint.
IMAGE_TAR := bin/trustbridge-image.tar
CA_CERTS  ?=
IMAGE_ARCH := $(shell $(GO) env GOARCH)
image:
	@mkdir -p bin/image
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/image/trustbridge ./cmd/trustbridge
	cd deploy/image && $(GO) run . -binary $(CURDIR)/bin/image/trustbridge -ca-certs '$(if $(CA_CERTS),$(abspath $(CA_CERTS)))' -arch $(IMAGE_ARCH) \
		-version $(VERSION) -revision "$$(git rev-parse HEAD 2>/dev/null)" \
		-created "$$(git log -1 --format=%ct 2>/dev/null || echo 0)" -out $(CURDIR)/$(IMAGE_TAR)

image-tests: image
	cd deploy/image && TRUSTBRIDGE_IMAGE=$(CURDIR)/$(IMAGE_TAR) TRUSTBRIDGE_IMAGE_TESTS=require $(GO) test -count=1 ./...

# kube-tools: kube-apiserver, kube-controller-manager and kubectl built from
# the k8s.io/kubernetes module pinned in internal/testkit/kubetest/tools (about 9
# minutes on 2 cores for the first, a few more for the controller manager,
# which shares its build cache; once, cached in bin/kube), and etcd from
# Debian's etcd-server package.
KUBE_DIR := bin/kube
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
kube-tools: $(KUBE_DIR)/kube-apiserver $(KUBE_DIR)/kube-controller-manager $(KUBE_DIR)/kubectl $(KUBE_DIR)/etcd

$(KUBE_DIR)/kube-apiserver: internal/testkit/kubetest/tools/go.mod internal/testkit/kubetest/tools/go.sum
	@mkdir -p $(KUBE_DIR)
	@echo "building kube-apiserver for the Kubernetes test tier (once; about 9 minutes on 2 cores)"
	cd internal/testkit/kubetest/tools && $(GO) build -o $(CURDIR)/$@.tmp k8s.io/kubernetes/cmd/kube-apiserver
	mv $@.tmp $@

# kube-controller-manager from the same pinned module, run with only its CSR
# signing controller: ca/upstream/kubecsr's tests get a certificate from
# Kubernetes' own built-in signer through it.
$(KUBE_DIR)/kube-controller-manager: internal/testkit/kubetest/tools/go.mod internal/testkit/kubetest/tools/go.sum
	@mkdir -p $(KUBE_DIR)
	cd internal/testkit/kubetest/tools && $(GO) build -o $(CURDIR)/$@.tmp k8s.io/kubernetes/cmd/kube-controller-manager
	mv $@.tmp $@

# kubectl from the same pinned module: deploy/'s tests run
# `kubectl apply --dry-run=server` of every overlay with it.
$(KUBE_DIR)/kubectl: internal/testkit/kubetest/tools/go.mod internal/testkit/kubetest/tools/go.sum
	@mkdir -p $(KUBE_DIR)
	cd internal/testkit/kubetest/tools && $(GO) build -o $(CURDIR)/$@.tmp k8s.io/kubernetes/cmd/kubectl
	mv $@.tmp $@

$(KUBE_DIR)/etcd:
	@mkdir -p $(KUBE_DIR)
	@command -v etcd >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server; }
	ln -sf "$$(command -v etcd)" $@

# spire-tools: spire-server and spire-agent v1.13.3 built from the module
# pinned in internal/testkit/spiretest/tools (about 4 minutes each on 2 cores,
# once; cached in bin/spire). The server federates with trustbridge; the agent
# is the reference node agent (SDS default and ROOTCA) ours is compared with.
# One file target each, so that an existing binary is never rebuilt for the
# other. GONOSUMDB: the checksum database does not know one of SPIRE's old
# dependencies; go.sum pins every hash anyway.
SPIRE_DIR := bin/spire
spire-tools: $(SPIRE_DIR)/spire-server $(SPIRE_DIR)/spire-agent

$(SPIRE_DIR)/spire-server $(SPIRE_DIR)/spire-agent: internal/testkit/spiretest/tools/go.mod internal/testkit/spiretest/tools/go.sum
	@mkdir -p $(SPIRE_DIR)
	@echo "building $(@F) for the SPIRE test tier (once; about 4 minutes on 2 cores)"
	cd internal/testkit/spiretest/tools && GONOSUMDB=github.com/GoogleCloudPlatform/cloudsql-proxy $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/$@.tmp github.com/spiffe/spire/cmd/$(@F)
	mv $@.tmp $@

# ui-tools: Debian's chromium for the status page's browser tests, installed
# once like kube-tools' etcd. TRUSTBRIDGE_CHROMIUM=/path/to/chromium makes
# the tests use another binary.
ui-tools:
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; }

# hsm-tools: Debian's softhsm2 (a PKCS#11 token in files) for ca/pkcs11's
# tests, installed once like kube-tools' etcd.
hsm-tools:
	@[ -e /usr/lib/softhsm/libsofthsm2.so ] || { $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends softhsm2; }

# ui-screenshot: regenerate docs/ui.png from the realistic snapshot in
# internal/server/statusui's tests (commit the result when the page changes).
ui-screenshot: ui-tools
	TRUSTBRIDGE_UI_TESTS=require $(GO) test -count=1 -run '^TestChromiumStatusPage$$' ./internal/server/statusui -update-screenshot

# fuzz: the fuzz campaign, recorded in FUZZING.md by internal/testkit/fuzzreport:
# every fuzz target in the module for FUZZTIME (default 1m), and those
# listed in internal/testkit/fuzzreport/long.txt (parsers added since the previous
# campaign) for FUZZTIME_LONG (default 10m), FUZZPARALLEL workers each.
# About 2.5 hours on 2 cores. Each result is appended to bin/fuzz/results.tsv
# as it ends: FUZZARGS=-resume goes on after an interruption, FUZZARGS='-run
# REGEXP' fuzzes only matching `package.Target`s. A crasher fails the
# campaign and is written to the package's testdata/fuzz, where make test
# runs it from then on.
FUZZTIME_LONG ?= 10m
FUZZPARALLEL ?= 2
FUZZARGS ?=
fuzz:
	$(GO) run ./internal/testkit/fuzzreport -time $(FUZZTIME) -longtime $(FUZZTIME_LONG) -parallel $(FUZZPARALLEL) \
		-minimizetime $(FUZZMINIMIZETIME) -results bin/fuzz/results.tsv -out FUZZING.md -notes internal/testkit/fuzzreport/NOTES.md \
		-cmd "make fuzz FUZZTIME=$(FUZZTIME) FUZZTIME_LONG=$(FUZZTIME_LONG) FUZZPARALLEL=$(FUZZPARALLEL)" $(FUZZARGS)

# bench: benchmarks, reported as ratios against a baseline measured in the
# same run, written to BENCHMARKS.md. internal/testkit/bundlebench runs bin/trustbridge
# (TRUSTBRIDGE_BIN) against a static-bytes server in a process of its own;
# TRUSTBRIDGE_BIN_BASE=/path/to/an/older/build adds an A/B of two versions.
#
# internal/testkit/signbench runs bin/trustbridge and SPIRE's server (from
# spire-tools) side by side, and Istio's client benchmark (bench-istio, in
# its own module, which ./... does not reach) runs after the rest: its
# rows land in the same report.
bench: build kube-tools spire-tools
	mkdir -p bin
	TRUSTBRIDGE_BIN=$(CURDIR)/$(BIN) TRUSTBRIDGE_KUBE_TESTS=require TRUSTBRIDGE_SPIRE_TESTS=require KUBEBUILDER_ASSETS=$(CURDIR)/$(KUBE_DIR) $(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) -timeout 3h ./... > bin/bench.txt || (cat bin/bench.txt; exit 1)
	$(MAKE) --no-print-directory bench-istio BENCHISTIO_COUNT=$(BENCHCOUNT)
	cat bin/bench-istio.txt >> bin/bench.txt
	$(GO) run ./internal/testkit/benchreport -in bin/bench.txt -out BENCHMARKS.md \
		-notes internal/testkit/benchreport/NOTES.md -cmd "make bench BENCHTIME=$(BENCHTIME) BENCHCOUNT=$(BENCHCOUNT)"

# bench-istio: CreateCertificate from Istio's own CA client in a process of
# its own (internal/testkit/istiotest/cmd/istioload) against bin/trustbridge, at 1, 8
# and 64 clients, as a ratio to in-process parse+sign measured in the same run
# (x-baseline-certs/s, and server CPU per certificate over the baseline's,
# x-baseline-cpu; issues 15 and 40). make bench runs it and reports its rows;
# alone, about a minute on 2 cores, its output in bin/bench-istio.txt.
BENCHISTIO_TIME ?= 5000x
BENCHISTIO_COUNT ?= 5
bench-istio: build
	mkdir -p bin
	cd internal/testkit/istiotest && TRUSTBRIDGE_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench BenchmarkIstioClientThroughput -benchtime $(BENCHISTIO_TIME) -count $(BENCHISTIO_COUNT) . > $(CURDIR)/bin/bench-istio.txt || (cat $(CURDIR)/bin/bench-istio.txt; exit 1)
	cat bin/bench-istio.txt

# proto: regenerate internal/identityapi from identity.proto (the generated
# code is committed; CI does not run this). protoc from Debian, the Go
# plugins at pinned versions into bin/proto.
PROTO_BIN := $(CURDIR)/bin/proto
proto:
	@command -v protoc >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler; }
	GOBIN=$(PROTO_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(PROTO_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
	cd internal/identityapi && PATH=$(PROTO_BIN):$$PATH protoc --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative identity.proto

# lint: staticcheck over the main module, and vet, tidy and staticcheck over
# the modules of their own that ./... does not reach.
# staticcheck is built once into bin/ and runs with GOFLAGS=$(RACE): it
# reads its dependencies' export data from `go list -export`, which then
# reuses what vet and unit compiled instead of compiling every dependency
# once more without the race detector. Each tool module is vetted and
# checked the way its tests build it: deploy/helm/test with $(RACE) (it
# shares unit's build), the others plain.
TOOL_MODULES := internal/testkit/istiotest internal/testkit/vaulttest deploy/helm/test deploy/image
RACE_MODULES := deploy/helm/test
STATICCHECK_BIN := bin/staticcheck-$(lastword $(subst @, ,$(STATICCHECK)))
$(STATICCHECK_BIN):
	@mkdir -p bin
	GOBIN=$(CURDIR)/bin/.staticcheck $(GO) install $(STATICCHECK)
	mv bin/.staticcheck/staticcheck $@ && rmdir bin/.staticcheck

lint: $(STATICCHECK_BIN)
	GOFLAGS=$(RACE) $(CURDIR)/$(STATICCHECK_BIN) ./...
	@set -e; for m in $(TOOL_MODULES); do \
		flags=; case " $(RACE_MODULES) " in *" $$m "*) flags="$(RACE)";; esac; \
		echo "lint $$m"; (cd $$m && $(GO) vet $$flags ./... && $(GO) mod tidy -diff && GOFLAGS=$$flags $(CURDIR)/$(STATICCHECK_BIN) ./...); \
	done

# shape: the house's measures (package main's size, long and complex
# functions, ca's exported names, internal/'s folders, imports running up
# to a domain package) and what each counts; make test holds them to the
# ceilings in internal/testkit/shape.
shape:
	$(GO) test -count=1 -run '^TestHouseShape$$' -v ./internal/testkit/shape

clean:
	rm -rf bin
