package server

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.yaml.in/yaml/v3"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/federation/kubelkg"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

type FederationConfig struct {
	Federate     string
	ConfigFile   string
	CAFile       string
	MinRefresh   time.Duration
	MaxRefresh   time.Duration
	Timeout      time.Duration
	AllowPrivate bool
	allowEmpty   bool
	// dynamic: endpoints come and go at run time (--federation-crd), so
	// the poller runs even with none configured here.
	dynamic bool
	// inline is the federation list of the --config file inlineFrom, in
	// the --federation-config schema, as parsed there (with its lines).
	inline     *yaml.Node
	inlineFrom string
}

func addFederationFlags(f *pflag.FlagSet, o *FederationConfig) {
	f.StringVar(&o.Federate, "federate", "", `trust domains to federate with: "td|https://url" (https_web) or "td|https://url|endpoint-spiffe-id|bundle-file" (https_spiffe; when the endpoint's SPIFFE ID is in td, td's bundle file authenticates the first fetch and may be left out only while a bundle of td is held; when it is in another trust domain, that one must be ours, federated here with its bundle, relayed by --bundle-file, or held), joined by "||" (env SPIFFE_BUNDLE_ENDPOINTS)`)
	f.StringVar(&o.ConfigFile, "federation-config", "", "YAML file of federation endpoints (spire-controller-manager ClusterFederatedTrustDomain field names)")
	f.StringVar(&o.CAFile, "federation-ca-file", "", "PEM roots trusted for https_web endpoints in addition to the system pool")
	f.DurationVar(&o.MinRefresh, "federation-min-refresh", federation.DefaultMinRefresh, "poll no more often than this, whatever a peer's refresh hint says")
	f.DurationVar(&o.MaxRefresh, "federation-max-refresh", federation.DefaultMaxRefresh, "poll at least this often")
	f.DurationVar(&o.Timeout, "federation-timeout", federation.DefaultFetchTimeout, "deadline for one whole bundle fetch")
	f.BoolVar(&o.AllowPrivate, "federation-allow-private", false, "allow endpoints (and redirects) on loopback, unspecified and link-local addresses, for labs; cloud metadata addresses stay refused (see README, Federation)")
	f.BoolVar(&o.allowEmpty, "federation-allow-empty", false, `apply a fetched "keys": [] (revoking every key) instead of refusing it`)
}

// federationSetup is the wired federation: the trust store and the poller.
type federationSetup struct {
	store  *trust.Store
	poller *federation.Poller // nil without endpoints
	// relayed are the trust domains --bundle-file puts in the store.
	relayed []spiffeid.TrustDomain

	// mu guards the sources of the poller's endpoints, which apply joins.
	mu sync.Mutex
	// static are the endpoints from flags and files; origins says where
	// each comes from: "flag" (--federate or SPIFFE_BUNDLE_ENDPOINTS) or
	// "file" (--federation-config, or the --config file's list).
	static  []federation.Endpoint
	origins map[spiffeid.TrustDomain]string
	// resources are the endpoints of the ClusterFederatedTrustDomain
	// resources (--federation-crd) as last applied.
	resources []federation.Endpoint
	// runtime is the federation changed at run time (federation add),
	// nil until manage wires it; its inForce endpoints join the union.
	runtime *runtimeFederation
	logger  *slog.Logger
}

// holds reports whether td's roots are in the store before any fetch, for
// the resources' first-fetch rule: relayed by a bundle file, or held by
// the poller (fetched, restored or in the last-known-good store).
func (fs *federationSetup) holds(td spiffeid.TrustDomain) bool {
	var held func(spiffeid.TrustDomain) bool
	if fs.poller != nil {
		held = fs.poller.Holds
	}
	return OrRelayed(held, fs.relayed)(td)
}

// revoked is the revoked set the poller holds for td (none without one):
// an operator's bundle for td must not bring one back.
func (fs *federationSetup) revoked(td spiffeid.TrustDomain) []federation.Revoked {
	if fs.poller == nil {
		return nil
	}
	return fs.poller.Revoked(td)
}

// staticSet is a copy of the endpoints of flags and files, sorted by trust
// domain, and where each comes from.
func (fs *federationSetup) staticSet() ([]federation.Endpoint, map[spiffeid.TrustDomain]string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return sortedEndpoints(fs.static), maps.Clone(fs.origins)
}

// configured is a copy of the endpoints of flags, files and run-time
// changes (trustbridge federation add), sorted by trust domain, and where
// each comes from: what the server was started to federate with, before
// any resource (--federation-crd) adds its own.
func (fs *federationSetup) configured() ([]federation.Endpoint, map[spiffeid.TrustDomain]string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	origins := maps.Clone(fs.origins)
	rt := fs.runtime.endpoints()
	for _, ep := range rt {
		origins[ep.TrustDomain] = OriginRuntime
	}
	return sortedEndpoints(slices.Concat(fs.static, rt)), origins
}

// origin is where td's federation is configured by flag or file; "" when
// it is not.
func (fs *federationSetup) origin(td spiffeid.TrustDomain) string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.origins[td]
}

// originOf says where a trust domain's federation is configured: flags
// and files first, then the resources of ctl (may be nil); "" when it is
// not configured.
func originOf(fs *federationSetup, ctl *crd.Controller) func(spiffeid.TrustDomain) string {
	return func(td spiffeid.TrustDomain) string {
		if o := fs.origin(td); o != "" {
			return o
		}
		if fs.runtime.has(td) {
			return OriginRuntime
		}
		if ctl != nil {
			return ctl.Origins()[td]
		}
		return ""
	}
}

// applyLocked sets the poller's endpoints to the union of every source:
// the static ones, the resources' and those added at run time. It is the
// one place that joins them; a new source keeps its endpoints in fs and
// adds them here. SetEndpoints is all or nothing, so on error the poller
// keeps its endpoints and the caller restores its source's.
func (fs *federationSetup) applyLocked() error {
	if fs.poller == nil {
		return errors.New("the server started without federation (no --federate, --federation-config or --federation-crd): restart it to federate")
	}
	return fs.poller.SetEndpoints(slices.Concat(fs.static, fs.resources, fs.runtime.endpoints()))
}

// applyCRD replaces the endpoints of the ClusterFederatedTrustDomain
// resources, then forgets the stored bundles of those that went away.
func (fs *federationSetup) applyCRD(eps []federation.Endpoint) error {
	gone, err := fs.applyResources(eps)
	if err != nil {
		return err
	}
	fs.forget(gone)
	return nil
}

// applyResources puts eps in force and returns the trust domains whose
// resource went away and that no other source configures.
func (fs *federationSetup) applyResources(eps []federation.Endpoint) ([]spiffeid.TrustDomain, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	old := fs.resources
	fs.resources = eps
	if err := fs.applyLocked(); err != nil {
		fs.resources = old
		return nil, err
	}
	var gone []spiffeid.TrustDomain
	for _, ep := range old {
		td := ep.TrustDomain
		if !slices.ContainsFunc(eps, func(n federation.Endpoint) bool { return n.TrustDomain == td }) && fs.origins[td] == "" && fs.runtime.holdsLocked(td) == "" {
			gone = append(gone, td)
		}
	}
	return gone, nil
}

// forget deletes the stored bundles of trust domains no longer federated
// (kubectl delete of their resource, federation remove with --storage
// kube): removing a peer withdraws its trust, and adding it again starts
// from its bootstrap bundle. Not under fs.mu: the store may be an API
// server that is slow to answer. The leader deletes; a follower's store
// refuses, as it should.
func (fs *federationSetup) forget(tds []spiffeid.TrustDomain) {
	for _, td := range tds {
		if err := fs.poller.Forget(td); err != nil && !errors.Is(err, kubelkg.ErrNotLeader) {
			fs.logger.Warn("the stored bundle of a trust domain no longer federated was not deleted: adding it again would start from these roots; delete it first (its last-known-good ConfigMap, or <data-dir>/federation/)",
				logattr.TrustDomain, td.Name(), logattr.Error, err)
		}
	}
}

// setStatic replaces the endpoints of flags and files (a reload).
func (fs *federationSetup) setStatic(fromFlag, fromFile []federation.Endpoint) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, ep := range slices.Concat(fromFlag, fromFile) {
		if what := fs.runtime.holdsLocked(ep.TrustDomain); what != "" {
			return fmt.Errorf("%s has %s set at run time: remove it with trustbridge federation remove %s before configuring it in flags or files", ep.TrustDomain.Name(), what, ep.TrustDomain.Name())
		}
	}
	old, oldOrigins := fs.static, fs.origins
	fs.setStaticLocked(fromFlag, fromFile)
	if err := fs.applyLocked(); err != nil {
		fs.static, fs.origins = old, oldOrigins
		return err
	}
	return nil
}

func (fs *federationSetup) setStaticLocked(fromFlag, fromFile []federation.Endpoint) {
	fs.static = slices.Concat(fromFlag, fromFile)
	fs.origins = map[spiffeid.TrustDomain]string{}
	for _, ep := range fromFlag {
		fs.origins[ep.TrustDomain] = "flag"
	}
	for _, ep := range fromFile {
		fs.origins[ep.TrustDomain] = "file"
	}
}

// StaticEndpoints reads the endpoints configured by --federate (or
// SPIFFE_BUNDLE_ENDPOINTS) and by --federation-config or the --config file's
// federation list, and checks them together, each with
// federation.CheckFirstFetch in that set, with td's roots (our CA's) and
// held (the last-known-good store; nil: nothing held). Warnings are
// problems that did not stop the configuration from loading.
func StaticEndpoints(o FederationConfig, td spiffeid.TrustDomain, held func(spiffeid.TrustDomain) bool) (fromFlag, fromFile []federation.Endpoint, warnings []string, err error) {
	if o.Federate == "" {
		o.Federate = os.Getenv("SPIFFE_BUNDLE_ENDPOINTS")
	}
	// A tuple's bundle file is read as named: relative to the working
	// directory, like any path on a command line.
	flagCfg, err := federation.ParseEndpointsConfig(o.Federate, func(p string) ([]byte, error) {
		return readSmallFile(p, bundledoc.DefaultMaxSize)
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--federate: %w", err)
	}
	fromFlag, warnings = flagCfg.Endpoints, flagCfg.Warnings
	fileCfg, fileFlag, fileName, err := federationFile(o)
	if err != nil {
		return nil, nil, nil, err
	}
	if fileCfg != nil {
		fromFile = fileCfg.Endpoints
		warnings = append(warnings, fileCfg.Warnings...)
	}
	// Flags and files are one set: an endpoint served by another trust
	// domain may rely on an entry of either for that trust domain's roots.
	anchors := &federation.Anchors{Local: td, Endpoints: slices.Concat(fromFlag, fromFile), Held: held}
	for _, ep := range fromFlag {
		if err := federation.CheckFirstFetch(ep, anchors); err != nil {
			return nil, nil, nil, fmt.Errorf("--federate %s: %w", ep, err)
		}
	}
	for i, ep := range fromFile {
		if err := federation.CheckFirstFetch(ep, anchors); err != nil {
			return nil, nil, nil, fmt.Errorf("%s %s: federation[%d] (%s): %w", fileFlag, fileName, i, ep.TrustDomain.Name(), err)
		}
	}
	eps, err := federation.MergeEndpoints(fromFlag, fromFile)
	if err != nil {
		return nil, nil, nil, err
	}

	for _, ep := range eps {
		if ep.TrustDomain == td {
			return nil, nil, nil, fmt.Errorf("federation endpoint %s is for our own trust domain %s; its bundle comes from our CA", ep, td.Name())
		}
	}
	return fromFlag, fromFile, warnings, nil
}

// checkFederationInputs reads and checks --federate (with its bundle
// files) and --federation-config as setupFederation will, before any
// state exists: a bad one must not leave a new CA behind. What the
// last-known-good store holds is not known yet (with Kubernetes storage,
// not before the API server is reached): an endpoint that may rely on it
// is given the benefit of the doubt here and judged again at setup.
func checkFederationInputs(o Config, td spiffeid.TrustDomain) error {
	held := func(spiffeid.TrustDomain) bool { return true }
	if fileStorage(o) {
		lkg := federation.NewLKGStore(o.DataDir)
		held = func(td spiffeid.TrustDomain) bool {
			e, err := lkg.Load(td)
			return err != nil || e != nil
		}
	}
	_, _, _, err := StaticEndpoints(o.Federation, td, held)
	return err
}

// federationFile reads the federation list of --federation-config or of
// the --config file (nil when there is neither), and says which flag and
// file it came from; bundle files it names are read relative to it.
func federationFile(o FederationConfig) (cfg *federation.Config, flag, name string, err error) {
	if o.ConfigFile == "" && o.inline == nil {
		return nil, "", "", nil
	}
	name, flag = o.inlineFrom, "--config"
	if o.inline == nil {
		name, flag = o.ConfigFile, "--federation-config"
	}
	base := filepath.Dir(name)
	readFile := func(p string) ([]byte, error) {
		if !filepath.IsAbs(p) {
			p = filepath.Join(base, p)
		}
		return readSmallFile(p, bundledoc.DefaultMaxSize)
	}
	if o.inline != nil {
		cfg, err = federation.ParseConfigList(o.inline, readFile)
	} else {
		var data []byte
		if data, err = readSmallFile(o.ConfigFile, 1<<20); err != nil {
			return nil, "", "", fmt.Errorf("--federation-config: %w", err)
		}
		cfg, err = federation.ParseConfig(data, readFile)
	}
	if err != nil {
		return nil, "", "", fmt.Errorf("%s %s: %w", flag, name, err)
	}
	return cfg, flag, name, nil
}

// setupFederation builds the trust store and the poller of the endpoints
// configured by flags and files. relayed are the trust domains whose
// bundles --bundle-file puts in the store (relayedTrustDomains).
func setupFederation(o FederationConfig, td spiffeid.TrustDomain, lkg federation.LastKnownGood, relayed []spiffeid.TrustDomain,
	onEvent func(federation.Event), reg prometheus.Registerer, logger *slog.Logger) (*federationSetup, error) {
	stored := func(d spiffeid.TrustDomain) bool { return federation.StoreHolds(lkg, d) }
	fromFlag, fromFile, warnings, err := StaticEndpoints(o, td, OrRelayed(stored, relayed))
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		logger.Warn("federation config", logattr.Warning, w)
	}
	fs := &federationSetup{store: trust.NewStore(), relayed: relayed, logger: logger}
	fs.setStaticLocked(fromFlag, fromFile)
	// A federation file may list peers only after a reload: the poller
	// runs for it even when it starts empty.
	hasFile := o.ConfigFile != "" || o.inline != nil
	if len(fs.static) == 0 && !o.dynamic && !hasFile {
		return fs, nil
	}
	webRoots, err := webRootPool(o.CAFile)
	if err != nil {
		return nil, err
	}
	fs.poller, err = federation.NewPoller(federation.PollerConfig{
		Endpoints: fs.static,
		Fetcher: federation.FetcherConfig{
			Timeout: o.Timeout, WebRoots: webRoots, AllowPrivate: o.AllowPrivate,
		},
		Policy:     federation.RefreshPolicy{Min: o.MinRefresh, Max: o.MaxRefresh},
		LKG:        lkg,
		Sink:       fs.store,
		AllowEmpty: o.allowEmpty,
		OnEvent:    onEvent,
		Logger:     logger.With(logattr.Component, "federation"),
		Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	for _, err := range fs.poller.LoadLastKnownGood() {
		logger.Error("last-known-good bundle not restored; that trust domain starts from its bootstrap bundle", logattr.Error, err)
	}
	return fs, nil
}

// webRootPool is the system pool plus --federation-ca-file.
func webRootPool(caFile string) (*x509.CertPool, error) {
	if caFile == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	data, err := readSmallFile(caFile, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("--federation-ca-file: %w", err)
	}
	certs, err := parsePEMCerts(data)
	if err != nil {
		return nil, fmt.Errorf("--federation-ca-file %s: %w", caFile, err)
	}
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}
