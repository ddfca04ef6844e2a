package agent

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/sds"
	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// maxCredentialFileSize bounds each credential file.
const maxCredentialFileSize = 1 << 20

// fileWatcher serves the credential files of a directory and reloads them
// when their content changes. A set that does not load (half written,
// mismatched key, another identity) leaves the last good one in place.
type fileWatcher struct {
	dir     string
	log     *slog.Logger
	metrics *metrics

	id    spiffeid.ID
	cell  *sds.CredentialCell
	trust *sds.TrustCell
	// wl is the same credential and trust, JWT authorities included,
	// for the Workload API.
	wl *wapi.Cell

	// good and bad are digests of the last set served and the last set
	// refused, so each change is loaded and logged once.
	good, bad     [sha256.Size]byte
	credDigest    [sha256.Size]byte
	rootsDigest   [sha256.Size]byte
	haveBadDigest bool
}

func newFileWatcher(dir string, log *slog.Logger, m *metrics) *fileWatcher {
	return &fileWatcher{dir: dir, log: log, metrics: m, trust: sds.NewTrustCell(), wl: wapi.NewCell()}
}

// credentialSet is the parsed content of the three files.
type credentialSet struct {
	id    spiffeid.ID
	chain []*x509.Certificate
	key   crypto.Signer
	roots map[spiffeid.TrustDomain][]*x509.Certificate
	// bundles are roots with the JWT authorities of the bundle map.
	bundles []*spiffebundle.Bundle

	digest, credDigest, rootsDigest [sha256.Size]byte
}

// init loads the files the first time; any error is fatal, since there is
// no last good set to keep.
func (w *fileWatcher) init() error {
	set, err := readCredentialSet(w.dir)
	if err != nil {
		return err
	}
	w.id = set.id
	w.cell = sds.NewCredentialCell(set.id)
	if err := w.apply(set); err != nil {
		return err
	}
	w.metrics.fileReloads.WithLabelValues(resultSuccess).Inc()
	return nil
}

// check reloads the files if they changed. Errors are logged and counted.
func (w *fileWatcher) check() {
	set, err := readCredentialSet(w.dir)
	var digest [sha256.Size]byte
	if err != nil {
		digest = sha256.Sum256([]byte(err.Error()))
	} else {
		digest = set.digest
	}
	if digest == w.good || (w.haveBadDigest && digest == w.bad) {
		return
	}
	if err == nil {
		err = w.apply(set)
	}
	if err != nil {
		w.bad, w.haveBadDigest = digest, true
		w.metrics.fileReloads.WithLabelValues(resultFailure).Inc()
		w.log.Warn("credential files did not load; still serving the last good ones",
			"credentials_dir", w.dir, logattr.Error, err.Error())
		return
	}
	w.haveBadDigest = false
	w.metrics.fileReloads.WithLabelValues(resultSuccess).Inc()
	w.log.Info("credential files reloaded", "credentials_dir", w.dir, logattr.SPIFFEID, set.id.String())
}

// apply publishes set: the credential first, since it is what can still
// be refused, so a refused set changes neither.
func (w *fileWatcher) apply(set *credentialSet) error {
	if set.id != w.id {
		return fmt.Errorf("%s now holds a certificate for %s, not %s; restart the agent to serve another identity",
			CertChainFile, set.id, w.id)
	}
	if set.credDigest != w.credDigest {
		if err := w.cell.Set(set.chain, set.key); err != nil {
			return fmt.Errorf("%s and %s: %w", CertChainFile, KeyFile, err)
		}
		w.credDigest = set.credDigest
	}
	if set.rootsDigest != w.rootsDigest {
		if err := w.trust.Set(bundlesOf(set.roots)); err != nil {
			return fmt.Errorf("%s and %s: %w", RootCertFile, BundleMapFile, err)
		}
		w.rootsDigest = set.rootsDigest
	}
	// The Workload API gets the set whole; Set refuses only what the
	// checks above already did.
	if err := w.wl.Set(wapi.State{SVID: &wapi.SVID{ID: set.id, Chain: set.chain, Key: set.key}, Bundles: set.bundles}); err != nil {
		return fmt.Errorf("workload API: %w", err)
	}
	w.good = set.digest
	return nil
}

// readCredentialSet reads and parses the three files of dir, and
// bundle.spiffe.json when it is there.
func readCredentialSet(dir string) (*credentialSet, error) {
	var data [3][]byte
	for i, name := range []string{CertChainFile, KeyFile, RootCertFile} {
		b, _, err := fileutil.Read(filepath.Join(dir, name), maxCredentialFileSize)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		data[i] = b
	}
	bundleMap, _, err := fileutil.Read(filepath.Join(dir, BundleMapFile), maxCredentialFileSize)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		bundleMap = nil
	case err != nil:
		return nil, fmt.Errorf("%s: %w", BundleMapFile, err)
	}
	return parseCredentialSet(data[0], data[1], data[2], bundleMap)
}

// parseCredentialSet parses a certificate chain (leaf first; a trailing
// self-signed root is dropped), a private key, the roots of the leaf's
// trust domain and, unless bundleMap is nil, a SPIFFE bundle map of the
// trust domains the workload may trust. The identity is the leaf's SPIFFE
// ID. root-cert.pem holds that trust domain's roots only: a root naming
// another trust domain there is refused, and a peer's roots are trusted
// only from the bundle map, for the trust domain they are listed under.
// The X.509 authorities of the map's entry for the local trust domain,
// if any, are ignored (root-cert.pem is the one source of the local
// roots); its JWT authorities, which root-cert.pem cannot hold, are the
// local trust domain's.
func parseCredentialSet(chainPEM, keyPEM, rootsPEM, bundleMap []byte) (*credentialSet, error) {
	chain, id, err := parseLeafChain(chainPEM)
	if err != nil {
		return nil, err
	}
	key, err := pemfile.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyFile, err)
	}
	roots, err := parseLocalRoots(rootsPEM, id.TrustDomain())
	if err != nil {
		return nil, err
	}
	grouped, bundles, err := parseFileBundles(bundleMap, id.TrustDomain(), roots)
	if err != nil {
		return nil, err
	}
	set := &credentialSet{id: id, chain: chain, key: key, roots: grouped, bundles: bundles}
	set.credDigest = lengthPrefixedDigest(chainPEM, keyPEM)
	set.rootsDigest = lengthPrefixedDigest(rootsPEM, bundleMap)
	set.digest = sha256.Sum256(append(set.credDigest[:], set.rootsDigest[:]...))
	return set, nil
}

// parseLeafChain parses cert-chain.pem, drops a trailing self-signed root,
// and returns the chain with its leaf's SPIFFE ID, which must name a
// workload.
func parseLeafChain(chainPEM []byte) ([]*x509.Certificate, spiffeid.ID, error) {
	chain, err := pemfile.ParseCertificates(chainPEM)
	if err != nil {
		return nil, spiffeid.ID{}, fmt.Errorf("%s: %w", CertChainFile, err)
	}
	for len(chain) > 1 && isSelfSignedCA(chain[len(chain)-1]) {
		chain = chain[:len(chain)-1]
	}
	id, err := x509svid.IDFromCert(chain[0])
	if err != nil {
		return nil, spiffeid.ID{}, fmt.Errorf("%s: leaf: %w", CertChainFile, err)
	}
	// X509-SVID §5: a leaf is no CA and names a workload, not a trust
	// domain.
	if chain[0].IsCA || id.Path() == "" {
		return nil, spiffeid.ID{}, fmt.Errorf("%s: leaf: %s is not a workload X509-SVID (CA certificate or no path)", CertChainFile, id)
	}
	return chain, id, nil
}

// parseLocalRoots parses root-cert.pem: CA certificates of the local
// trust domain only.
func parseLocalRoots(rootsPEM []byte, local spiffeid.TrustDomain) ([]*x509.Certificate, error) {
	roots, err := pemfile.ParseCertificates(rootsPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", RootCertFile, err)
	}
	for i, r := range roots {
		if !r.BasicConstraintsValid || !r.IsCA {
			return nil, fmt.Errorf("%s: certificate %d is not a CA certificate", RootCertFile, i)
		}
	}
	if err := caclient.CheckLocalRoots(RootCertFile, local, roots); err != nil {
		return nil, err
	}
	return roots, nil
}

// lengthPrefixedDigest is the SHA-256 of parts, each preceded by its
// length, so that moving bytes from one part to the next changes it.
func lengthPrefixedDigest(parts ...[]byte) (d [sha256.Size]byte) {
	h := sha256.New()
	for _, b := range parts {
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	h.Sum(d[:0])
	return d
}

func isSelfSignedCA(c *x509.Certificate) bool {
	return c.IsCA && bytes.Equal(c.RawSubject, c.RawIssuer) && c.CheckSignatureFrom(c) == nil
}

// parseFileBundles parses the optional bundle map (nil: none) into the
// X.509 roots per trust domain SDS serves and the bundles, JWT
// authorities included, the Workload API serves. The local trust
// domain's X.509 roots are roots (root-cert.pem), whatever the map says;
// its JWT authorities, which root-cert.pem cannot hold, come from the map.
func parseFileBundles(bundleMap []byte, local spiffeid.TrustDomain, roots []*x509.Certificate) (map[spiffeid.TrustDomain][]*x509.Certificate, []*spiffebundle.Bundle, error) {
	var parsed []*spiffebundle.Bundle
	if bundleMap != nil {
		var err error
		if parsed, _, err = bundledoc.ParseMap(bundleMap); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", BundleMapFile, err)
		}
		if len(parsed) > maxTrustDomains {
			return nil, nil, fmt.Errorf("%s: %d trust domains; at most %d are accepted", BundleMapFile, len(parsed), maxTrustDomains)
		}
	}
	own := spiffebundle.FromX509Authorities(local, roots)
	grouped := map[spiffeid.TrustDomain][]*x509.Certificate{local: roots}
	bundles := []*spiffebundle.Bundle{own}
	for _, b := range parsed {
		if b.TrustDomain() == local {
			own.SetJWTAuthorities(b.JWTAuthorities())
			continue
		}
		if r := b.X509Authorities(); len(r) > 0 {
			grouped[b.TrustDomain()] = r
		}
		bundles = append(bundles, b)
	}
	return grouped, bundles, nil
}
