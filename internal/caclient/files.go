package caclient

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/pemfile"
)

// Size caps of the files read here.
const (
	MaxTokenFileSize = authn.MaxTokenSize + 1024 // room for surrounding whitespace
	MaxPEMFileSize   = 1 << 20
)

// Names of the files WriteCredentials writes and LoadCertDir reads, as
// `trustbridge ca issue` and Istio name them, and the bundle map of every
// trust domain the workload may trust, named as in the distributed
// ConfigMap.
const (
	KeyFile       = "key.pem"
	ChainFile     = "cert-chain.pem"
	RootsFile     = "root-cert.pem"
	BundleMapFile = "bundle.spiffe.json"
	// OwnerFile (0600) marks a directory whose credentials trustbridge
	// wrote: WriteCredentials writes it before the credentials, so the
	// agent renews them in place, and never takes over a directory
	// another tool keeps (csi-driver-spiffe's, say) without it.
	OwnerFile = ".trustbridge-owned"
)

// ownerNote is OwnerFile's content, for whoever finds it.
const ownerNote = "trustbridge wrote the credentials in this directory and renews them here; remove this file to stop trustbridge agent --ca-addr from overwriting them\n"

// Trust is what a workload trusts, kept per trust domain: a root is
// trusted for a trust domain only because it came from that trust domain's
// bundle.
type Trust struct {
	// TrustDomain is the workload's own.
	TrustDomain spiffeid.TrustDomain
	// Local are TrustDomain's roots: root-cert.pem, and the only roots
	// that may vouch for TrustDomain.
	Local []*x509.Certificate
	// Bundles are the X.509 roots of every trust domain the workload may
	// trust, as the server's SDS ALL hands them out (bundle.spiffe.json).
	// TrustDomain's entry is always Local. Nil writes no bundle map and
	// removes one left by an earlier run, so no stale federated trust
	// stays next to new credentials.
	Bundles map[spiffeid.TrustDomain][]*x509.Certificate
	// Withheld are trust domains the server grants only with peer limits
	// (its trust policy), which a bundle map cannot carry: they are left
	// out of Bundles rather than trusted for every member.
	Withheld []spiffeid.TrustDomain
}

// BundleMap renders t.Bundles, with Local as TrustDomain's roots, as a
// SPIFFE bundle map (X.509 authorities only, no refresh hints).
func (t Trust) BundleMap() ([]byte, error) {
	bundles := make([]*spiffebundle.Bundle, 0, len(t.Bundles)+1)
	for td, roots := range t.Bundles {
		if td != t.TrustDomain && len(roots) > 0 {
			bundles = append(bundles, spiffebundle.FromX509Authorities(td, roots))
		}
	}
	bundles = append(bundles, spiffebundle.FromX509Authorities(t.TrustDomain, t.Local))
	return bundledoc.MarshalMap(bundles)
}

// ParseBundleMap reads a bundle map's X.509 roots per trust domain, as
// BundleMap writes them (JWT authorities are ignored). A trust domain
// without X.509 roots is left out.
func ParseBundleMap(doc []byte) (map[spiffeid.TrustDomain][]*x509.Certificate, error) {
	bundles, _, err := bundledoc.ParseMap(doc)
	if err != nil {
		return nil, err
	}
	out := make(map[spiffeid.TrustDomain][]*x509.Certificate, len(bundles))
	for _, b := range bundles {
		if roots := b.X509Authorities(); len(roots) > 0 {
			out[b.TrustDomain()] = roots
		}
	}
	return out, nil
}

// WriteCredentials writes key.pem (0600), cert-chain.pem (leaf first, no
// roots), root-cert.pem (trust.Local: the workload's own trust domain's
// roots, never a peer's) and bundle.spiffe.json (trust.Bundles, per trust
// domain). Every file is staged (synced, with its final mode) before any
// replaces its predecessor: when dir is also where the current
// credentials come from, a failure part-way must not leave a new key.pem
// next to the old cert-chain.pem, a pair that no longer matches and
// cannot renew. A symlink in dir is replaced, never written through.
func WriteCredentials(dir string, key crypto.Signer, chain []*x509.Certificate, trust Trust) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if len(trust.Local) == 0 {
		return errors.New("no roots of the workload's own trust domain to write")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files, err := credentialFiles(keyDER, chain, trust)
	if err != nil {
		return err
	}
	if err := checkNoDirs(dir, files); err != nil {
		return err
	}
	// The mark goes first: credentials without it are refused by the
	// agent as another tool's, so a crash here must not leave them.
	if err := markOwned(dir); err != nil {
		return err
	}
	if err := replaceFiles(dir, files); err != nil {
		return err
	}
	if trust.Bundles == nil {
		if err := os.Remove(filepath.Join(dir, BundleMapFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return fileutil.SyncDir(dir)
}

// credentialFiles are the files WriteCredentials writes, with their
// contents and modes: the bundle map only when trust has Bundles.
func credentialFiles(keyDER []byte, chain []*x509.Certificate, trust Trust) ([]credFile, error) {
	files := []credFile{
		{KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600},
		{ChainFile, EncodeCerts(chain), 0o644},
		{RootsFile, EncodeCerts(trust.Local), 0o644},
	}
	if trust.Bundles != nil {
		doc, err := trust.BundleMap()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", BundleMapFile, err)
		}
		files = append(files, credFile{BundleMapFile, doc, 0o644})
	}
	return files, nil
}

// checkNoDirs refuses to go on when a directory stands where one of files
// is to be written: the rename over it would fail after others succeeded.
func checkNoDirs(dir string, files []credFile) error {
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			return fmt.Errorf("%s is a directory", p)
		}
	}
	return nil
}

// replaceFiles stages every one of files in dir before renaming any over
// its predecessor, so a failure while writing leaves the old set whole.
// Staged files not renamed are removed.
func replaceFiles(dir string, files []credFile) error {
	staged := make([]string, len(files))
	defer func() {
		for _, tmp := range staged {
			if tmp != "" {
				_ = os.Remove(tmp)
			}
		}
	}()
	for i, f := range files {
		tmp, err := stageFile(dir, f.name, f.data, f.perm)
		if err != nil {
			return err
		}
		staged[i] = tmp
	}
	for i, f := range files {
		if err := os.Rename(staged[i], filepath.Join(dir, f.name)); err != nil {
			return err
		}
		staged[i] = ""
	}
	return nil
}

// markOwned writes OwnerFile in dir unless it is there.
func markOwned(dir string) error {
	p := filepath.Join(dir, OwnerFile)
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
		return nil
	}
	return fileutil.Write(p, []byte(ownerNote), 0o600)
}

// ForeignCredentials lists the credentials in dir another tool wrote: a
// certificate chain or key, when OwnerFile is not there.
func ForeignCredentials(dir string) (foreign []string, err error) {
	if _, err := os.Lstat(filepath.Join(dir, OwnerFile)); err == nil {
		return nil, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, name := range []string{ChainFile, KeyFile} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			foreign = append(foreign, name)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return foreign, nil
}

// credFile is one file WriteCredentials writes.
type credFile struct {
	name string
	data []byte
	perm os.FileMode
}

// stageFile writes data with perm to a new temporary file in dir, synced,
// and returns its path for a rename over name. internal/fileutil writes
// one file; here the renames of three must come after all three writes.
func stageFile(dir, name string, data []byte, perm os.FileMode) (string, error) {
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return "", err
	}
	// The mode is set before any byte is written (CreateTemp makes 0600).
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
	}
	return f.Name(), nil
}

// EncodeCerts is certs as concatenated PEM CERTIFICATE blocks.
func EncodeCerts(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// LoadCertDir loads cert-chain.pem and key.pem of dir as a client
// certificate (Leaf set) and returns its SPIFFE ID; a certificate expired
// at now is refused here rather than by the server, with advice.
func LoadCertDir(dir string, now time.Time) (*tls.Certificate, spiffeid.ID, error) {
	chainPEM, err := ReadFile(filepath.Join(dir, ChainFile), MaxPEMFileSize)
	if err != nil {
		return nil, spiffeid.ID{}, err
	}
	keyPEM, err := ReadFile(filepath.Join(dir, KeyFile), MaxPEMFileSize)
	if err != nil {
		return nil, spiffeid.ID{}, err
	}
	cert, err := tls.X509KeyPair(chainPEM, keyPEM)
	if err != nil {
		return nil, spiffeid.ID{}, fmt.Errorf("%s: %w", dir, err)
	}
	id, err := x509svid.IDFromCert(cert.Leaf)
	if err != nil {
		return nil, spiffeid.ID{}, fmt.Errorf("%s/%s is not an X509-SVID: %w", dir, ChainFile, err)
	}
	if now.After(cert.Leaf.NotAfter) {
		return nil, spiffeid.ID{}, fmt.Errorf("the certificate for %s in %s expired at %s; bootstrap again with --token-file", id, dir, cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return &cert, id, nil
}

// ReadToken reads a bearer token file: surrounding whitespace (a trailing
// newline) is not part of the token.
func ReadToken(path string) (string, error) {
	data, err := ReadFile(path, MaxTokenFileSize)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	if strings.ContainsAny(token, " \t\r\n") {
		return "", fmt.Errorf("%s holds more than one line or word; want the token alone", path)
	}
	return token, nil
}

// ReadPEMCerts reads and parses a PEM file of certificates (ParsePEMCerts).
func ReadPEMCerts(path string) ([]*x509.Certificate, error) {
	data, err := ReadFile(path, MaxPEMFileSize)
	if err != nil {
		return nil, err
	}
	certs, err := ParsePEMCerts(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return certs, nil
}

// ParsePEMCerts parses every CERTIFICATE block, skipping text and blocks
// of other types (pemfile.FindCertificates): --root-cert may name a CA
// bundle with comments between its roots. There must be one.
func ParsePEMCerts(data []byte) ([]*x509.Certificate, error) {
	return pemfile.FindCertificates(data)
}

// ReadFile reads at most limit bytes of a regular file (internal/fileutil).
func ReadFile(path string, limit int64) ([]byte, error) {
	data, _, err := fileutil.ReadFile(path, limit)
	return data, err
}
