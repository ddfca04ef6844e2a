package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Bundle endpoint profiles (SPIFFE Federation §5.2).
const (
	profileSPIFFE = "https_spiffe"
	profileWeb    = "https_web"
)

// filePollInterval is how often bundle and certificate files are checked;
// updateInterval how often the served documents are re-checked anyway.
const (
	filePollInterval = 10 * time.Second
	updateInterval   = 30 * time.Second
)

type bundleOptions struct {
	listen        string
	path          string
	profile       string
	endpointID    string
	tlsCert       string
	tlsKey        string
	acmeDomains   []string
	acmeEmail     string
	acmeDirectory string
	acmeTOS       bool
	files         []string
	serveOthers   bool
}

func addBundleFlags(f *pflag.FlagSet, o *bundleOptions) {
	f.StringVar(&o.listen, "bundle-listen", ":8443", `address of the SPIFFE bundle endpoint ("" disables it)`)
	f.StringVar(&o.path, "bundle-path", "/", "path of the local trust domain's bundle on the endpoint")
	f.StringVar(&o.profile, "bundle-profile", profileSPIFFE, "endpoint profile: https_spiffe (X509-SVID from our CA) or https_web (Web PKI certificate from files or ACME)")
	f.StringVar(&o.endpointID, "bundle-endpoint-spiffe-id", "", "https_spiffe: SPIFFE ID of the endpoint's certificate (default spiffe://<trust-domain>/trustbridge/bundle-endpoint)")
	f.StringVar(&o.tlsCert, "bundle-tls-cert", "", "https_web: certificate chain file (PEM), reloaded on change")
	f.StringVar(&o.tlsKey, "bundle-tls-key", "", "https_web: private key file (PEM), reloaded on change")
	f.StringSliceVar(&o.acmeDomains, "acme-domain", nil, "https_web: obtain the certificate by ACME for these names (repeatable)")
	f.StringVar(&o.acmeEmail, "acme-email", "", "https_web: ACME account contact")
	f.StringVar(&o.acmeDirectory, "acme-directory-url", "", "https_web: ACME directory (default Let's Encrypt production)")
	f.BoolVar(&o.acmeTOS, "acme-tos-accepted", false, "https_web: accept the ACME CA's terms of service (required with --acme-domain)")
	f.StringArrayVar(&o.files, "bundle-file", nil, "serve a bundle document from a file, reloaded on change: FILE for the local trust domain (static mode, instead of the CA's bundle) or TD=FILE for another (relay); repeatable")
	f.BoolVar(&o.serveOthers, "serve-federated", true, "serve bundles of other trust domains at /bundles/{trustDomain} and /bundle-map")
}

// bundleEndpoint is the wired bundle server and what keeps it current.
type bundleEndpoint struct {
	srv      *bundleserver.Server
	ln       net.Listener
	url      string
	id       spiffeid.ID // https_spiffe only
	certHost string      // https_web: the name the certificate is for
	// checks report problems for /readyz: a bad certificate or bundle
	// file change (the last good one is still served).
	checks  []func() error
	files   []*bundleserver.FileSource
	runners []func(context.Context) error
}

func setupBundleEndpoint(o bundleOptions, td spiffeid.TrustDomain, dataDir string, workloadTTL, refreshHint time.Duration,
	authority *ca.Authority, fed *federationSetup, reg prometheus.Registerer, logger *slog.Logger) (_ *bundleEndpoint, err error) {
	ep := &bundleEndpoint{}
	var unsubscribe func()
	defer func() {
		// A failed setup runs nothing, so nothing else would release the
		// trust store subscription.
		if err != nil && unsubscribe != nil {
			unsubscribe()
		}
	}()
	srvLogger := logger // bundleserver names its own component
	logger = logger.With(logattr.Component, "bundle-endpoint")

	if err := checkBundleFlags(o, td); err != nil {
		return nil, err
	}
	getCert, nextProtos, err := ep.certificate(o, td, dataDir, workloadTTL, authority, logger)
	if err != nil {
		return nil, err
	}

	// Sources: the CA's bundle, unless a file replaces it (static mode),
	// and bundle files of other trust domains (relay).
	var local bundleserver.Source = authority
	changes := []<-chan struct{}{authority.Changes()}
	if fed != nil {
		// Federated bundles change the store; serve them as their
		// endpoints published them.
		storeChanges, cancel := fed.store.Subscribe()
		unsubscribe = cancel
		ep.runners = append(ep.runners, func(ctx context.Context) error { <-ctx.Done(); cancel(); return nil })
		changes = append(changes, storeChanges)
	}
	var others []*bundleserver.FileSource
	seen := map[spiffeid.TrustDomain]string{}
	for _, spec := range o.files {
		name, path, found := strings.Cut(spec, "=")
		fileTD := td
		if !found {
			path = spec
		} else if fileTD, err = bundledoc.TrustDomainName(name); err != nil {
			return nil, fmt.Errorf("--bundle-file %q: trust domain %q: %w", spec, name, err)
		}
		if prev, dup := seen[fileTD]; dup {
			return nil, fmt.Errorf("--bundle-file %q: trust domain %s already comes from %q", spec, fileTD.Name(), prev)
		}
		seen[fileTD] = spec
		fs := bundleserver.NewFileSource(path, fileTD, logger)
		if err := fs.Load(); err != nil {
			return nil, fmt.Errorf("--bundle-file %q: %w", spec, err)
		}
		ep.runners = append(ep.runners, func(ctx context.Context) error { return fs.Run(ctx, filePollInterval) })
		ep.files = append(ep.files, fs)
		ep.checks = append(ep.checks, func() error {
			if err := fs.LastError(); err != nil {
				return fmt.Errorf("--bundle-file %s: %w (serving the last good bundle)", spec, err)
			}
			return nil
		})
		changes = append(changes, fs.Changes())
		if fileTD == td {
			local = fs
			logger.Warn("serving the local trust domain's bundle from a file (static mode); the CA's own roots are not published unless the file holds them", "file", path)
			continue
		}
		others = append(others, fs)
	}

	srv, err := bundleserver.New(bundleserver.Config{
		TrustDomain: td,
		Local:       local,
		Path:        o.path,
		RefreshHint: refreshHint,
		Others: func() []*spiffebundle.Bundle {
			var out []*spiffebundle.Bundle
			if fed != nil && fed.poller != nil {
				out = append(out, fed.poller.Bundles()...)
			}
			for _, fs := range others {
				if b := fs.Bundle(); b != nil {
					out = append(out, b)
				}
			}
			return out
		},
		ServeOthers:    o.serveOthers,
		GetCertificate: getCert,
		NextProtos:     nextProtos,
		Logger:         srvLogger,
		Registerer:     reg,
	})
	if err != nil {
		return nil, err
	}
	ep.srv = srv
	// Bundle files are trust sources too: the trust store (and through it
	// SDS and peer verification) holds them under their trust domain.
	syncFiles := func() {
		if fed == nil {
			return
		}
		for _, fs := range append([]*bundleserver.FileSource{}, others...) {
			if b := fs.Bundle(); b != nil {
				fed.store.Set("file:"+fs.Path(), b)
			}
		}
	}
	syncFiles()
	ep.runners = append(ep.runners, func(ctx context.Context) error {
		return updateOnChange(ctx, srv, logger, syncFiles, changes...)
	})

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, fmt.Errorf("--bundle-listen: %w", err)
	}
	ep.ln = ln
	ep.url = "https://" + net.JoinHostPort(ep.publicHost(ln.Addr()), portOf(ln.Addr())) + o.path
	ep.runners = append(ep.runners, func(ctx context.Context) error { return srv.Serve(ctx, ln) })
	return ep, nil
}

// certificate sets up the serving certificate for the chosen profile.
// There is no fallback from one profile to the other (Federation §7.1).
func (ep *bundleEndpoint) certificate(o bundleOptions, td spiffeid.TrustDomain, dataDir string, workloadTTL time.Duration,
	authority *ca.Authority, logger *slog.Logger) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), []string, error) {
	webFlags := o.tlsCert != "" || o.tlsKey != "" || len(o.acmeDomains) > 0
	switch o.profile {
	case profileSPIFFE:
		if webFlags {
			return nil, nil, errors.New("--bundle-tls-cert, --bundle-tls-key and --acme-domain need --bundle-profile https_web")
		}
		idText := o.endpointID
		if idText == "" {
			idText = "spiffe://" + td.Name() + "/trustbridge/bundle-endpoint"
		}
		id, err := spiffeid.FromString(idText)
		if err != nil {
			return nil, nil, fmt.Errorf("--bundle-endpoint-spiffe-id %q: %w", idText, err)
		}
		if !id.MemberOf(td) {
			return nil, nil, fmt.Errorf("--bundle-endpoint-spiffe-id %q: our CA signs only %s identities", idText, td.Name())
		}
		sc, err := authority.ServingCert(id, workloadTTL)
		if err != nil {
			return nil, nil, err
		}
		ep.id = id
		ep.runners = append(ep.runners, sc.Run)
		return sc.GetCertificate, nil, nil
	case profileWeb:
		if o.endpointID != "" {
			return nil, nil, errors.New("--bundle-endpoint-spiffe-id needs --bundle-profile https_spiffe")
		}
		switch {
		case len(o.acmeDomains) > 0 && (o.tlsCert != "" || o.tlsKey != ""):
			return nil, nil, errors.New("use either --acme-domain or --bundle-tls-cert/--bundle-tls-key, not both")
		case len(o.acmeDomains) > 0:
			ep.certHost = o.acmeDomains[0]
			if !strings.HasSuffix(o.listen, ":443") {
				logger.Warn("ACME validates TLS-ALPN-01 on port 443; make sure port 443 reaches --bundle-listen", "bundle_listen", o.listen)
			}
			acme, err := bundleserver.NewACME(bundleserver.ACMEConfig{
				Domains: o.acmeDomains, Email: o.acmeEmail, DirectoryURL: o.acmeDirectory,
				TOSAccepted: o.acmeTOS, CacheDir: filepath.Join(dataDir, "acme"),
			}, logger)
			if err != nil {
				return nil, nil, err
			}
			return acme.GetCertificate, acme.TLSConfig().NextProtos, nil
		case o.tlsCert != "" && o.tlsKey != "":
			fc := bundleserver.NewFileCertificate(o.tlsCert, o.tlsKey, clock.RealClock{}, logger)
			if err := fc.Load(); err != nil {
				return nil, nil, err
			}
			if c, err := fc.GetCertificate(nil); err == nil && c != nil && c.Leaf != nil && len(c.Leaf.DNSNames) > 0 {
				ep.certHost = c.Leaf.DNSNames[0]
			}
			ep.runners = append(ep.runners, func(ctx context.Context) error { return fc.Run(ctx, filePollInterval) })
			ep.checks = append(ep.checks, func() error {
				if err := fc.LastError(); err != nil {
					return fmt.Errorf("--bundle-tls-cert: %w (serving the last good certificate)", err)
				}
				return nil
			})
			return fc.GetCertificate, nil, nil
		default:
			return nil, nil, errors.New("--bundle-profile https_web needs --bundle-tls-cert and --bundle-tls-key, or --acme-domain")
		}
	default:
		return nil, nil, fmt.Errorf("--bundle-profile %q: want https_spiffe or https_web", o.profile)
	}
}

// updateOnChange re-renders the served documents whenever a source
// changes, until ctx is done.
func updateOnChange(ctx context.Context, srv *bundleserver.Server, logger *slog.Logger, onChange func(), changes ...<-chan struct{}) error {
	merged := make(chan struct{}, 1)
	for _, ch := range changes {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-ch:
					select {
					case merged <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	// A periodic update too: cheap when nothing changed, and it catches
	// a change signal another reader of a shared channel took.
	tick := time.NewTicker(updateInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-merged:
		case <-tick.C:
		}
		onChange()
		if err := srv.Update(); err != nil {
			// bundleserver logs each refusal once; this is for debugging.
			logger.Debug("bundle update refused; the last good document stays served", logattr.Error, err)
		}
	}
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
func checkBundleFlags(o bundleOptions, td spiffeid.TrustDomain) error {
	if len(o.acmeDomains) == 0 && (o.acmeEmail != "" || o.acmeDirectory != "" || o.acmeTOS) {
		return errors.New("--acme-email, --acme-directory-url and --acme-tos-accepted need --acme-domain")
	}
	for _, spec := range o.files {
		if _, _, found := strings.Cut(spec, "="); !found && o.profile == profileSPIFFE {
			// Peers of a self-serving https_spiffe endpoint authenticate
			// each fetch with the bundle they fetched last; a served file
			// without our CA's roots would lock them out after one fetch.
			return fmt.Errorf("--bundle-file %q serves the local bundle from a file, which needs --bundle-profile https_web: with https_spiffe, peers verify the endpoint against the served bundle, which may not hold our CA's roots", spec)
		}
		if _, _, found := strings.Cut(spec, "="); found && !o.serveOthers {
			return fmt.Errorf("--bundle-file %q relays another trust domain, but --serve-federated=false serves none", spec)
		}
	}
	return nil
}

// tuple is the federation configuration peers write for this endpoint, in
// the --federate / SPIFFE_BUNDLE_ENDPOINTS form.
func (ep *bundleEndpoint) tuple(td spiffeid.TrustDomain) string {
	t := td.Name() + "|" + ep.url
	if !ep.id.IsZero() {
		t += "|" + ep.id.String()
	}
	return t
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
	return nil
}
