package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Bundle endpoint profiles (SPIFFE Federation §5.2).
const (
	ProfileSPIFFE = "https_spiffe"
	ProfileWeb    = "https_web"
)

// filePollInterval is how often bundle and certificate files are checked.
const filePollInterval = 10 * time.Second

type BundleConfig struct {
	Listen        string
	Path          string
	Profile       string
	EndpointID    string
	TLSCert       string
	TLSKey        string
	ACMEDomains   []string
	acmeEmail     string
	acmeDirectory string
	acmeTOS       bool
	Files         []string
	ServeOthers   bool
	// RelayIssuers are --relay-jwt-issuer TD=URL: relayed trust domains
	// served as OIDC issuers (oidc_discovery.go).
	RelayIssuers []string
	// Conns bound the listener's connections; idleTimeout (0:
	// bundleserver.DefaultIdleTimeout) how long a connection waits for
	// its next request (conn_limits.go).
	Conns       ConnLimits
	IdleTimeout time.Duration
}

func addBundleFlags(f *pflag.FlagSet, o *BundleConfig) {
	f.StringVar(&o.Listen, "bundle-listen", ":8443", `address of the SPIFFE bundle endpoint ("" disables it)`)
	f.StringVar(&o.Path, "bundle-path", "/", "path of the local trust domain's bundle on the endpoint")
	f.StringVar(&o.Profile, "bundle-profile", ProfileSPIFFE, "endpoint profile: https_spiffe (X509-SVID from our CA) or https_web (Web PKI certificate from files or ACME)")
	f.StringVar(&o.EndpointID, "bundle-endpoint-spiffe-id", "", "https_spiffe: SPIFFE ID of the endpoint's certificate (default spiffe://<trust-domain>/trustbridge/bundle-endpoint)")
	f.StringVar(&o.TLSCert, "bundle-tls-cert", "", "https_web: certificate chain file (PEM), reloaded on change")
	f.StringVar(&o.TLSKey, "bundle-tls-key", "", "https_web: private key file (PEM), reloaded on change")
	f.StringSliceVar(&o.ACMEDomains, "acme-domain", nil, "https_web: obtain the certificate by ACME for these names (repeatable)")
	f.StringVar(&o.acmeEmail, "acme-email", "", "https_web: ACME account contact")
	f.StringVar(&o.acmeDirectory, "acme-directory-url", "", "https_web: ACME directory (default Let's Encrypt production)")
	f.BoolVar(&o.acmeTOS, "acme-tos-accepted", false, "https_web: accept the ACME CA's terms of service (required with --acme-domain)")
	f.StringArrayVar(&o.Files, "bundle-file", nil, "serve a bundle document from a file, reloaded on change: FILE for the local trust domain (static mode, instead of the CA's bundle) or TD=FILE for another (relay); repeatable")
	f.BoolVar(&o.ServeOthers, "serve-federated", true, "serve bundles of other trust domains at /bundles/{trustDomain} and /bundle-map")
	f.StringArrayVar(&o.RelayIssuers, "relay-jwt-issuer", nil, "https_web: serve a relayed trust domain's JWT authorities (--bundle-file TD=FILE) as the OIDC issuer URL, whose tokens its own server mints with --jwt-issuer URL: TD=URL, "+
		"e.g. prod.example=https://oidc.example.com/prod (docs/oidc-discovery.md); repeatable, one issuer per trust domain")
	bundleLimits.AddFlags(f, &o.Conns, "bundle endpoint", "peers behind one NAT address: a peer fetches over one connection at a time", serverMemoryNote(bundleLimits))
	f.DurationVar(&o.IdleTimeout, "bundle-idle-timeout", bundleserver.DefaultIdleTimeout, "how long the bundle endpoint keeps a connection with no request in flight open for the next one. "+
		"Peers fetch once per refresh hint, minutes apart, so a long one holds memory for nothing: with 60s, one request every 50 s held a connection for good")
}

// bundleEndpoint is the wired bundle server and what keeps it current.
type bundleEndpoint struct {
	endpoint *bundleserver.Endpoint
	ln       net.Listener
	url      string
	id       spiffeid.ID // https_spiffe only
	certHost string      // https_web: the name the certificate is for
	// checks report problems of the serving certificate for /readyz (the
	// last good one is still served); the endpoint reports its files'.
	checks  []func() error
	runners []func(context.Context) error
	// reloads re-read its files now, on SIGHUP (each is polled anyway).
	reloads []reloader
	// getCert is the serving certificate now; issuers the OIDC issuers
	// served (oidc_discovery.go).
	getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	issuers []configuredIssuer
	// acmeDomains are --acme-domain: with ACME, the names the certificate
	// is obtained for (oidc_status.go).
	acmeDomains []string
	// dnsNames are the host names of its certificate (https_web), which
	// the admin API refuses to mint.
	dnsNames []string
}

func setupBundleEndpoint(o BundleConfig, td spiffeid.TrustDomain, jwtIssuer, dataDir string, workloadTTL, refreshHint time.Duration,
	authority *ca.Authority, fed *federationSetup, reg prometheus.Registerer, logger *slog.Logger) (_ *bundleEndpoint, err error) {
	ep := &bundleEndpoint{}
	if err := checkBundleFlags(o, td); err != nil {
		return nil, err
	}
	getCert, nextProtos, err := ep.certificate(o, td, dataDir, workloadTTL, authority, logger.With(logattr.Component, "bundle-endpoint"))
	if err != nil {
		return nil, err
	}
	issuers, err := ep.setupIssuers(o, jwtIssuer, td, getCert)
	if err != nil {
		return nil, err
	}
	cfg := bundleserver.EndpointConfig{
		Config: bundleserver.Config{
			TrustDomain: td, Local: caBundleSource{authority}, Path: o.Path, RefreshHint: refreshHint, ServeOthers: o.ServeOthers,
			GetCertificate: getCert, NextProtos: nextProtos, Logger: logger, Registerer: reg,
			Timeouts: bundleserver.Timeouts{Idle: o.IdleTimeout}, Issuers: issuers,
		},
		Changes:          []<-chan struct{}{authority.Subscribe()},
		Files:            o.Files,
		FilePollInterval: filePollInterval,
	}
	if fed != nil {
		// Federated bundles come from the trust store, every consumer's
		// one source, as their endpoints published them (sequence
		// included): a new sequence on the same keys is a change here.
		storeChanges, cancel := fed.store.SubscribePublished()
		defer func() {
			// A failed setup runs nothing, so nothing else would release
			// the trust store subscription.
			if err != nil {
				cancel()
			}
		}()
		ep.runners = append(ep.runners, func(ctx context.Context) error { <-ctx.Done(); cancel(); return nil })
		cfg.Changes = append(cfg.Changes, storeChanges)
		cfg.Others = func() []*spiffebundle.Bundle { return servedOthers(fed.store.Published()) }
		// Bundle files are trust sources too: the trust store (and
		// through it SDS and peer verification) holds them under their
		// trust domain.
		cfg.OnRelayed = func(path string, b *spiffebundle.Bundle) { fed.store.Set("file:"+path, b) }
	}
	if ep.endpoint, err = bundleserver.NewEndpoint(cfg); err != nil {
		return nil, bundleFileFlagError(err, "--bundle-file %q: %w")
	}
	for _, f := range ep.endpoint.Files() {
		ep.reloads = append(ep.reloads, checkReloader("--bundle-file "+f.Path(), f.Check))
	}
	ln, err := bundleLimits.listen(o.Listen, o.Conns, reg, logger)
	if err != nil {
		return nil, err
	}
	ep.ln, ep.url = ln, "https://"+net.JoinHostPort(ep.publicHost(ln.Addr()), portOf(ln.Addr()))+o.Path
	srv := ep.endpoint.Server()
	ep.runners = append(ep.runners, ep.endpoint.Run, func(ctx context.Context) error { return srv.Serve(ctx, ln) })
	return ep, nil
}

// servedOthers are the bundles the endpoint serves for other trust
// domains, as their source set them, one per trust domain: a polled
// endpoint's (fetched, or its bootstrap bundle until then) or one set at
// run time (bundle set), whatever else reads the trust store holds. The
// endpoint serves relayed bundle files from the files themselves.
func servedOthers(p *trust.Published) []*spiffebundle.Bundle {
	return p.BundlesOf(func(td spiffeid.TrustDomain) string {
		if _, ok := p.Bundle(td, staticSource); ok {
			return staticSource
		}
		return federation.SourceName(td)
	})
}

// bundleFileFlagError names a bundle file problem by its --bundle-file
// value; format has a verb for the value and %w for the problem.
func bundleFileFlagError(err error, format string) error {
	var fe *bundleserver.FileError
	if errors.As(err, &fe) {
		return fmt.Errorf(format, fe.Spec, fe.Err)
	}
	return err
}

// certificate sets up the serving certificate for the chosen profile.
// There is no fallback from one profile to the other (Federation §7.1).
func (ep *bundleEndpoint) certificate(o BundleConfig, td spiffeid.TrustDomain, dataDir string, workloadTTL time.Duration,
	authority *ca.Authority, logger *slog.Logger) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), []string, error) {
	switch o.Profile {
	case ProfileSPIFFE:
		getCert, err := ep.spiffeCertificate(o, td, workloadTTL, authority)
		return getCert, nil, err
	case ProfileWeb:
		return ep.webCertificate(o, dataDir, logger)
	default:
		return nil, nil, fmt.Errorf("--bundle-profile %q: want https_spiffe or https_web", o.Profile)
	}
}

// spiffeCertificate is an X509-SVID from our CA for the endpoint's ID.
func (ep *bundleEndpoint) spiffeCertificate(o BundleConfig, td spiffeid.TrustDomain, workloadTTL time.Duration,
	authority *ca.Authority) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error) {
	if o.TLSCert != "" || o.TLSKey != "" || len(o.ACMEDomains) > 0 {
		return nil, errors.New("--bundle-tls-cert, --bundle-tls-key and --acme-domain need --bundle-profile https_web")
	}
	idText := o.EndpointID
	if idText == "" {
		idText = "spiffe://" + td.Name() + "/trustbridge/bundle-endpoint"
	}
	id, err := spiffeid.FromString(idText)
	if err != nil {
		return nil, fmt.Errorf("--bundle-endpoint-spiffe-id %q: %w", idText, err)
	}
	if !id.MemberOf(td) {
		return nil, fmt.Errorf("--bundle-endpoint-spiffe-id %q: our CA signs only %s identities", idText, td.Name())
	}
	sc, err := authority.ServingCert(id, workloadTTL)
	if err != nil {
		return nil, err
	}
	ep.id = id
	ep.runners = append(ep.runners, sc.Run)
	return sc.GetCertificate, nil
}

// webCertificate is a Web PKI certificate from ACME or from files.
func (ep *bundleEndpoint) webCertificate(o BundleConfig, dataDir string, logger *slog.Logger) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), []string, error) {
	if o.EndpointID != "" {
		return nil, nil, errors.New("--bundle-endpoint-spiffe-id needs --bundle-profile https_spiffe")
	}
	switch {
	case len(o.ACMEDomains) > 0 && (o.TLSCert != "" || o.TLSKey != ""):
		return nil, nil, errors.New("use either --acme-domain or --bundle-tls-cert/--bundle-tls-key, not both")
	case len(o.ACMEDomains) > 0:
		ep.certHost, ep.acmeDomains, ep.dnsNames = o.ACMEDomains[0], o.ACMEDomains, o.ACMEDomains
		if !strings.HasSuffix(o.Listen, ":443") {
			logger.Warn("ACME validates TLS-ALPN-01 on port 443; make sure port 443 reaches --bundle-listen", "bundle_listen", o.Listen)
		}
		acme, err := bundleserver.NewACME(bundleserver.ACMEConfig{
			Domains: o.ACMEDomains, Email: o.acmeEmail, DirectoryURL: o.acmeDirectory,
			TOSAccepted: o.acmeTOS, CacheDir: filepath.Join(dataDir, "acme"),
		}, logger)
		if err != nil {
			return nil, nil, err
		}
		return acme.GetCertificate, acme.TLSConfig().NextProtos, nil
	case o.TLSCert != "" && o.TLSKey != "":
		getCert, err := ep.fileCertificate(o, logger)
		return getCert, nil, err
	default:
		return nil, nil, errors.New("--bundle-profile https_web needs --bundle-tls-cert and --bundle-tls-key, or --acme-domain")
	}
}

// fileCertificate reads the certificate and key files, reloaded on change.
func (ep *bundleEndpoint) fileCertificate(o BundleConfig, logger *slog.Logger) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error) {
	fc := bundleserver.NewFileCertificate(o.TLSCert, o.TLSKey, clock.RealClock{}, logger)
	if err := fc.Load(); err != nil {
		return nil, err
	}
	if c, err := fc.GetCertificate(nil); err == nil && c != nil && c.Leaf != nil && len(c.Leaf.DNSNames) > 0 {
		ep.certHost, ep.dnsNames = c.Leaf.DNSNames[0], c.Leaf.DNSNames
	}
	ep.runners = append(ep.runners, func(ctx context.Context) error { return fc.Run(ctx, filePollInterval) })
	ep.reloads = append(ep.reloads, checkReloader("--bundle-tls-cert", fc.Check))
	ep.checks = append(ep.checks, func() error {
		if err := fc.LastError(); err != nil {
			return fmt.Errorf("--bundle-tls-cert: %w (serving the last good certificate)", err)
		}
		return nil
	})
	return fc.GetCertificate, nil
}

// publicHost names the endpoint in the URL peers should configure: for
// https_web the name its certificate is for (peers check it), else the
// listen address, with a wildcard replaced by this host's name.
func (ep *bundleEndpoint) publicHost(addr net.Addr) string {
	if ep.certHost != "" {
		return ep.certHost
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return host
}

func portOf(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	_, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return ""
	}
	return port
}

// checkBundleFlags refuses combinations that would start a server peers
// cannot use, or flags that would silently do nothing.
func checkBundleFlags(o BundleConfig, td spiffeid.TrustDomain) error {
	if len(o.ACMEDomains) == 0 && (o.acmeEmail != "" || o.acmeDirectory != "" || o.acmeTOS) {
		return errors.New("--acme-email, --acme-directory-url and --acme-tos-accepted need --acme-domain")
	}
	for _, spec := range o.Files {
		if _, _, found := strings.Cut(spec, "="); !found && o.Profile == ProfileSPIFFE {
			// Peers of a self-serving https_spiffe endpoint authenticate
			// each fetch with the bundle they fetched last; a served file
			// without our CA's roots would lock them out after one fetch.
			return fmt.Errorf("--bundle-file %q serves the local bundle from a file, which needs --bundle-profile https_web: with https_spiffe, peers verify the endpoint against the served bundle, which may not hold our CA's roots", spec)
		}
		if _, _, found := strings.Cut(spec, "="); found && !o.ServeOthers {
			return fmt.Errorf("--bundle-file %q relays another trust domain, but --serve-federated=false serves none", spec)
		}
	}
	return nil
}

// RelayedTrustDomains are the trust domains --bundle-file relays
// ("TD=FILE") when the bundle endpoint runs: their roots join the trust
// store from the file before any fetch, so they anchor a first fetch as a
// held bundle does (federation.CheckFirstFetch). A spec that does not parse
// counts for nothing here; the bundle endpoint refuses it.
func RelayedTrustDomains(o BundleConfig) []spiffeid.TrustDomain {
	if o.Listen == "" {
		return nil
	}
	var out []spiffeid.TrustDomain
	for _, spec := range o.Files {
		// A bare FILE is the local bundle's: the zero trust domain here.
		if td, _, err := bundleserver.ParseFileSpec(spec, spiffeid.TrustDomain{}); err == nil && !td.IsZero() {
			out = append(out, td)
		}
	}
	return out
}

// OrRelayed is held, true also for the relayed trust domains.
func OrRelayed(held func(spiffeid.TrustDomain) bool, relayed []spiffeid.TrustDomain) func(spiffeid.TrustDomain) bool {
	return func(td spiffeid.TrustDomain) bool {
		return slices.Contains(relayed, td) || held != nil && held(td)
	}
}

// tuple is the federation configuration peers write for this endpoint, in
// the --federate / SPIFFE_BUNDLE_ENDPOINTS form. With https_spiffe the
// endpoint serves its own trust domain's bundle, so peers need that bundle
// for their first fetch (federation.CheckFirstFetch): the fourth field
// names the file bootstrapFile says how to make.
func (ep *bundleEndpoint) tuple(td spiffeid.TrustDomain) string {
	t := td.Name() + "|" + ep.url
	if !ep.id.IsZero() {
		t += "|" + ep.id.String() + "|" + bootstrapFile(td)
	}
	return t
}

// bootstrapFile is the file name the banner tells peers to keep our
// bundle in.
func bootstrapFile(td spiffeid.TrustDomain) string { return td.Name() + ".json" }

// bootstrapCommand is how this server's operator exports the bundle
// https_spiffe peers need once (the admin API's /v1/bundle, on the admin
// listener they reach), "" for https_web, whose peers need none.
func (ep *bundleEndpoint) bootstrapCommand(td spiffeid.TrustDomain, admin string) string {
	if ep.id.IsZero() {
		return ""
	}
	return fmt.Sprintf("curl -s http://%s/v1/bundle > %s", admin, bootstrapFile(td))
}

// Ready reports the first problem of the endpoint's reloaded inputs.
func (ep *bundleEndpoint) Ready() error {
	if ep == nil {
		return nil
	}
	for _, check := range ep.checks {
		if err := check(); err != nil {
			return err
		}
	}
	return bundleFileFlagError(ep.endpoint.Ready(), "--bundle-file %s: %w")
}

// fetchers is admin.Config.Fetchers: the clients of td's bundle document
// on this endpoint, by remote address (a load balancer's, behind one).
func (ep *bundleEndpoint) fetchers(td spiffeid.TrustDomain) func() []api.BundleFetcher {
	return func() []api.BundleFetcher {
		var out []api.BundleFetcher
		for _, f := range ep.endpoint.Server().Fetchers(td) {
			out = append(out, api.BundleFetcher{Client: f.Client, UserAgent: f.UserAgent, LastFetch: f.LastFetch, Sequence: f.Sequence})
		}
		return out
	}
}
