package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/federation/managed"
	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/admin"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// The run-time federation (issue 22): `trustbridge federation add|remove`
// and `bundle set` against the admin API. With file storage the changes
// persist in the data directory (federation/managed); with Kubernetes
// storage they are ClusterFederatedTrustDomain resources (--federation-crd).

// AdminTokenName is the admin token's file in the data directory.
const AdminTokenName = "admin.token"

// OriginRuntime is the origin of a trust domain added at run time.
const OriginRuntime = "runtime"

// staticSource names static bundles (bundle set) in the trust store; the
// admin API shows them with this origin.
const staticSource = api.OriginStatic

// runtimeFederation is what the admin API needs to change the federation.
type runtimeFederation struct {
	manager   admin.Manager
	managed   *managed.Manager // file storage only
	token     string
	tokenFile string
	// forget deletes a removed trust domain's last-known-good bundle
	// (the poller's Forget, with file storage; nil: nothing to delete).
	forget func(spiffeid.TrustDomain) error
	// inForce is the managed state applied, guarded by the
	// federationSetup's mu (not the manager's lock, which is held while
	// it applies: reading it from there would invert the locks).
	inForce managed.State
}

// has reports whether td is managed at run time (nil-safe).
func (r *runtimeFederation) has(td spiffeid.TrustDomain) bool {
	return r != nil && r.managed != nil && r.managed.Has(td)
}

// holdsLocked says what the run-time state in force sets for td: "an
// endpoint" (federation add), "a static bundle" (bundle set) or "" (nil-
// safe; under the federationSetup's mu).
func (r *runtimeFederation) holdsLocked(td spiffeid.TrustDomain) string {
	if r == nil {
		return ""
	}
	if slices.ContainsFunc(r.inForce.Endpoints, func(ep federation.Endpoint) bool { return ep.TrustDomain == td }) {
		return "an endpoint"
	}
	if slices.ContainsFunc(r.inForce.Bundles, func(b *spiffebundle.Bundle) bool { return b.TrustDomain() == td }) {
		return "a static bundle"
	}
	return ""
}

// changed hears of each run-time change once applied and persisted: it
// goes to the audit log, and a removed peer's stored bundle is deleted.
// Removing a peer withdraws its trust, also from the data directory:
// otherwise adding it again, say with a new --bundle after its CA was
// compromised, would restore the old roots and let them authenticate the
// first fetch. Only once the removal is saved: a removal that could not
// be saved is undone and keeps its bundle. The poller's Forget orders the
// deletion after any save of a poll that ended before the removal.
func (r *runtimeFederation) changed(audit func(managed.Change), logger *slog.Logger) func(managed.Change) {
	return func(c managed.Change) {
		audit(c)
		if c.Kind != managed.KindRemoved || r.forget == nil {
			return
		}
		if err := r.forget(c.TrustDomain); err != nil {
			logger.Error("a removed peer's stored bundle could not be deleted: adding it again would start from these roots; delete <data-dir>/federation/ entry of this trust domain first",
				logattr.TrustDomain, c.TrustDomain.Name(), logattr.Error, err)
		}
	}
}

// configure mounts the run-time routes on the admin API (nil-safe).
func (r *runtimeFederation) configure(cfg *admin.Config) {
	if r == nil {
		return
	}
	cfg.Manager, cfg.Token, cfg.TokenFile = r.manager, r.token, r.tokenFile
	if r.managed != nil {
		cfg.Static = func() []spiffeid.TrustDomain {
			var out []spiffeid.TrustDomain
			for _, b := range r.managed.State().Bundles {
				out = append(out, b.TrustDomain())
			}
			return out
		}
	}
}

// manage writes a new admin token into the data directory and loads and
// applies the run-time federation persisted there (file storage).
func (p *serverParts) manage(o Config, logger *slog.Logger) error {
	token, file, err := writeAdminToken(o.DataDir)
	if err != nil {
		return err
	}
	rt := &runtimeFederation{token: token, tokenFile: file}
	p.fed.runtime = rt
	if !fileStorage(o) {
		return p.manageKube(o, rt)
	}
	fs := p.fed
	if fs.poller != nil {
		rt.forget = fs.poller.Forget
	}
	m, warnings, err := managed.New(managed.Config{
		Dir: o.DataDir, Local: p.td,
		Reserved: fs.reservedBy, Others: fs.others, Held: fs.holds, Revoked: fs.revoked,
		Apply: fs.applyManaged, Probe: fs.probe(o.Federation),
		OnChange: rt.changed(p.trail.runtimeChange, logger),
	})
	if err != nil {
		return fmt.Errorf("run-time federation: %w", err)
	}
	for _, w := range warnings {
		logger.Warn("run-time federation", logattr.Warning, w)
	}
	rt.managed, rt.manager = m, m
	return nil
}

// writeAdminToken writes a new random token, mode 0600, at each start:
// whoever can read the data directory may change the federation; the
// token is never logged.
func writeAdminToken(dataDir string) (token, path string, err error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", "", err
	}
	token = hex.EncodeToString(raw)
	path, err = filepath.Abs(filepath.Join(dataDir, AdminTokenName))
	if err != nil {
		return "", "", err
	}
	if err := fileutil.Write(path, []byte(token+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("admin token: %w", err)
	}
	return token, path, nil
}

// endpoints are the run-time endpoints in force (nil-safe), for
// federationSetup.applyLocked, under its mu.
func (r *runtimeFederation) endpoints() []federation.Endpoint {
	if r == nil {
		return nil
	}
	return r.inForce.Endpoints
}

// applyManaged puts a run-time state in force: its endpoints polled (in
// the union), its static bundles in the trust store.
func (fs *federationSetup) applyManaged(s managed.State) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	// The manager checked s against reservedBy before it applied; a
	// reload may have configured a trust domain since. Checked again
	// under the lock that a reload takes too.
	for _, td := range s.TrustDomains() {
		if where := fs.reservedByLocked(td); where != "" {
			return fmt.Errorf("%w: %s is configured by %s; change it there", managed.ErrReserved, td.Name(), where)
		}
	}
	old := fs.runtime.inForce
	fs.runtime.inForce = s
	if err := fs.applyLocked(); err != nil {
		fs.runtime.inForce = old
		return err
	}
	for _, b := range old.Bundles {
		if !slices.ContainsFunc(s.Bundles, func(n *spiffebundle.Bundle) bool { return n.TrustDomain() == b.TrustDomain() }) {
			fs.store.Remove(staticSource, b.TrustDomain())
		}
	}
	for _, b := range s.Bundles {
		fs.store.Set(staticSource, b)
	}
	return nil
}

// reservedBy says where else td is configured: flags, files, resources,
// a relayed bundle file.
func (fs *federationSetup) reservedBy(td spiffeid.TrustDomain) string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.reservedByLocked(td)
}

func (fs *federationSetup) reservedByLocked(td spiffeid.TrustDomain) string {
	switch fs.origins[td] {
	case "flag":
		return "--federate (or SPIFFE_BUNDLE_ENDPOINTS)"
	case "file":
		return "--federation-config (or the --config file's federation list)"
	}
	if slices.ContainsFunc(fs.resources, func(ep federation.Endpoint) bool { return ep.TrustDomain == td }) {
		return "a ClusterFederatedTrustDomain resource"
	}
	if slices.Contains(fs.relayed, td) {
		return "--bundle-file (relayed)"
	}
	return ""
}

// others are the endpoints configured by flags, files and resources.
func (fs *federationSetup) others() []federation.Endpoint {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return slices.Concat(fs.static, fs.resources)
}

// probe fetches a new endpoint's bundle once, as its first poll would:
// with the fetcher's settings, its bootstrap bundle (else what the trust
// store holds) authenticating an https_spiffe server, and the poller's
// verdict on the document.
func (fs *federationSetup) probe(o FederationConfig) func(context.Context, federation.Endpoint) error {
	return func(ctx context.Context, ep federation.Endpoint) error {
		webRoots, err := webRootPool(o.CAFile)
		if err != nil {
			return err
		}
		roots := federation.BundleSourceFunc(func(td spiffeid.TrustDomain) (*x509bundle.Bundle, bool) {
			if td == ep.TrustDomain && ep.BootstrapBundle != nil {
				return x509bundle.FromX509Authorities(td, ep.BootstrapBundle.X509Authorities()), true
			}
			return fs.store.X509BundleFor(td)
		})
		f := federation.NewFetcher(federation.FetcherConfig{Timeout: o.Timeout, WebRoots: webRoots, AllowPrivate: o.AllowPrivate, Roots: roots})
		res, err := f.Fetch(ctx, ep, "")
		if err != nil {
			return err
		}
		if res.Bundle == nil {
			return errors.New("no bundle in the answer")
		}
		_, err = federation.CheckBundle(nil, res.Bundle, res.Warnings, o.allowEmpty)
		return err
	}
}

// runtimeChange records a run-time change with who asked for it, and for
// an update what changed.
func (t *auditTrail) runtimeChange(c managed.Change) {
	reason := "by " + c.Actor + " (admin API)"
	if len(c.Changes) > 0 {
		reason += ": " + strings.Join(c.Changes, ", ")
	}
	t.record(audit.Entry{
		Event: c.Kind, TrustDomain: c.TrustDomain.Name(), SourceURL: c.EndpointURL,
		Added: fingerprints(federation.Fingerprints(c.Bundle)), Reason: reason,
	})
}

// manageKube makes federation add|remove write ClusterFederatedTrustDomain
// resources, which every replica's controller applies; without
// --federation-crd they are refused, saying so.
func (p *serverParts) manageKube(o Config, rt *runtimeFederation) error {
	if p.crd == nil {
		rt.manager = kubeManager{}
		return nil
	}
	// Flags, files and relayed bundle files, as with file storage (the
	// resources are this manager's own). A reload changes no trust
	// domain of these with --federation-crd, so a snapshot holds.
	reserved := map[spiffeid.TrustDomain]string{}
	_, origins := p.fed.staticSet()
	for _, td := range slices.Concat(slices.Collect(maps.Keys(origins)), p.fed.relayed) {
		reserved[td] = p.fed.reservedBy(td)
	}
	m, err := crd.NewManager(crd.ManagerConfig{
		Dynamic: p.kube.dynamic, Controller: p.crd, ClassName: o.Kube.FederationClass,
		Local: p.td, Reserved: reserved, Others: p.fed.others, Held: p.fed.holds,
		Probe: p.fed.probe(o.Federation), OnChange: p.trail.runtimeChange,
	})
	rt.manager = m
	return err
}

// kubeManager refuses every change: with Kubernetes storage the run-time
// federation is ClusterFederatedTrustDomain resources, which need
// --federation-crd.
type kubeManager struct{}

func (kubeManager) refuse() error {
	return fmt.Errorf("%w: with --storage kube, run-time federation is ClusterFederatedTrustDomain resources, and this server runs without --federation-crd: "+
		"restart it with --federation-crd (the CRD is deploy/base/crd.yaml)", managed.ErrInvalid)
}

func (k kubeManager) Add(context.Context, federation.Endpoint, managed.AddOptions) error {
	return k.refuse()
}

func (k kubeManager) Update(context.Context, spiffeid.TrustDomain, managed.Edit, managed.AddOptions) error {
	return k.refuse()
}

func (k kubeManager) Remove(context.Context, spiffeid.TrustDomain, managed.RemoveOptions) error {
	return k.refuse()
}

func (k kubeManager) SetBundle(context.Context, *spiffebundle.Bundle, string) (string, error) {
	return "", k.refuse()
}
