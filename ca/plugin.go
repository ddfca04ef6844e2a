package ca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/pemfile"
)

// Istio's plug-in CA layout ("cacerts" secret), as written by its
// tools/certs Makefiles and expected by istiod.
const (
	pluginCertFile  = "ca-cert.pem"
	pluginKeyFile   = "ca-key.pem"
	pluginChainFile = "cert-chain.pem"
	pluginRootFile  = "root-cert.pem"

	// maxPluginFileSize bounds what a misconfigured mount (a log file, a
	// device) can make us read; real files are a few kilobytes.
	maxPluginFileSize = 1 << 20

	// pluginLoadAttempts is how often Load re-reads a directory caught
	// mid-update before giving up: a Kubernetes secret update swaps one
	// symlink, so the next read is normally consistent.
	pluginLoadAttempts = 3

	// DefaultPluginPollInterval is used when NewPluginWatcher is given no
	// positive interval.
	DefaultPluginPollInterval = 10 * time.Second
)

// errPluginDirChanging reports that the files changed between two reads:
// a writer is mid-update, which is a reason to look again, not a fault.
var errPluginDirChanging = fileutil.ErrChanging

// PluginMaterial is validated plug-in CA material. It is shared between
// readers and must not be modified.
type PluginMaterial struct {
	Cert          *x509.Certificate   // ca-cert.pem
	Key           crypto.Signer       // ca-key.pem
	Intermediates []*x509.Certificate // cert-chain.pem minus Cert and minus any roots, in chain order
	Roots         []*x509.Certificate // root-cert.pem
	Digest        [32]byte            // SHA-256 over the four files' bytes, to detect change
}

// pluginFiles is one read of the four files.
type pluginFiles struct {
	cert, key, chain, roots []byte
	keyMode                 fs.FileMode
	digest                  [32]byte
}

// LoadPluginDir reads and validates an Istio plug-in CA directory
// (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) at time now.
// Warnings describe problems worth fixing that must not stop a server,
// such as a private key readable by others.
func LoadPluginDir(dir string, td spiffeid.TrustDomain, now time.Time) (*PluginMaterial, []string, error) {
	files, err := readPluginSnapshot(dir, readPluginFiles)
	if err != nil {
		return nil, nil, fmt.Errorf("ca: plug-in CA directory %s: %w", dir, err)
	}
	m, warnings, err := validatePlugin(files, dir, td, now)
	if err != nil {
		return nil, nil, fmt.Errorf("ca: plug-in CA directory %s: %w", dir, err)
	}
	return m, warnings, nil
}

// readPluginSnapshot reads the files twice and insists both reads agree,
// so a cert from one generation is never paired with a key from another.
func readPluginSnapshot(dir string, read func(string) (*pluginFiles, error)) (*pluginFiles, error) {
	first, err := read(dir)
	if err != nil {
		return nil, err
	}
	second, err := read(dir)
	if err != nil || second.digest != first.digest {
		// A file that vanished between the reads is also a writer at work;
		// if it stays gone, the next first read reports it.
		return nil, errPluginDirChanging
	}
	return first, nil
}

func readPluginFiles(dir string) (*pluginFiles, error) {
	var (
		f   pluginFiles
		err error
	)
	if f.cert, _, err = readPluginFile(dir, pluginCertFile); err != nil {
		return nil, err
	}
	if f.key, f.keyMode, err = readPluginFile(dir, pluginKeyFile); err != nil {
		return nil, err
	}
	if f.chain, _, err = readPluginFile(dir, pluginChainFile); err != nil {
		return nil, err
	}
	if f.roots, _, err = readPluginFile(dir, pluginRootFile); err != nil {
		return nil, err
	}
	// Length prefixes keep bytes moved from one file to the next from
	// producing the same digest.
	h := sha256.New()
	for _, b := range [][]byte{f.cert, f.key, f.chain, f.roots} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
		h.Write(b)
	}
	h.Sum(f.digest[:0])
	return &f, nil
}

// readPluginFile follows symlinks on purpose: Kubernetes mounts secrets as
// links into a "..data" directory.
func readPluginFile(dir, name string) ([]byte, fs.FileMode, error) {
	data, mode, err := fileutil.Read(filepath.Join(dir, name), maxPluginFileSize)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", name, pathless(err))
	}
	return data, mode, nil
}

// pathless drops the path from an *fs.PathError, since callers already
// name the directory and file; errors.Is still sees the cause.
func pathless(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// validatePlugin parses the files of a plug-in CA directory and checks
// them in turn: the signing certificate and its key, the chain's order,
// the roots, the intermediates, then what depends on the time (verify).
// The warnings are about files that are valid but unsafe.
func validatePlugin(f *pluginFiles, dir string, td spiffeid.TrustDomain, now time.Time) (*PluginMaterial, []string, error) {
	p, err := parsePluginFiles(f)
	if err != nil {
		return nil, nil, err
	}
	if err := checkPluginSigner(p.cert, p.key, td); err != nil {
		return nil, nil, err
	}
	if err := checkPluginChainOrder(p.cert, p.chain); err != nil {
		return nil, nil, err
	}
	if err := checkPluginRoots(p.roots, td); err != nil {
		return nil, nil, err
	}
	intermediates, err := pluginIntermediates(p.chain, p.roots, td)
	if err != nil {
		return nil, nil, err
	}
	m := &PluginMaterial{Cert: p.cert, Key: p.key, Intermediates: intermediates, Roots: p.roots, Digest: f.digest}
	if err := m.verify(now); err != nil {
		return nil, nil, err
	}
	return m, pluginKeyWarnings(dir, f.keyMode), nil
}

// parsedPlugin is the content of a plug-in CA directory's files, parsed
// but not yet checked.
type parsedPlugin struct {
	cert         *x509.Certificate
	key          crypto.Signer
	chain, roots []*x509.Certificate
}

// parsePluginFiles parses the four files: exactly one certificate in
// ca-cert.pem, its key, the chain and the roots.
func parsePluginFiles(f *pluginFiles) (parsedPlugin, error) {
	var p parsedPlugin
	certs, err := pluginCerts(pluginCertFile, f.cert)
	if err != nil {
		return p, err
	}
	if len(certs) != 1 {
		return p, fmt.Errorf("%s: holds %d certificates, want exactly 1", pluginCertFile, len(certs))
	}
	p.cert = certs[0]
	if p.key, err = pluginKey(f.key); err != nil {
		return p, err
	}
	if p.chain, err = pluginCerts(pluginChainFile, f.chain); err != nil {
		return p, err
	}
	p.roots, err = pluginCerts(pluginRootFile, f.roots)
	return p, err
}

// checkPluginSigner checks the signing certificate and its key: a key
// strong enough and matching, a CA of trust domain td.
func checkPluginSigner(cert *x509.Certificate, key crypto.Signer, td spiffeid.TrustDomain) error {
	if err := checkPluginPublicKey(key.Public()); err != nil {
		return fmt.Errorf("%s: %w", pluginKeyFile, err)
	}
	if !publicKeysMatch(key.Public(), cert.PublicKey) {
		return fmt.Errorf("%s: private key does not match the public key of %s", pluginKeyFile, pluginCertFile)
	}
	if err := checkPluginCA(cert); err != nil {
		return fmt.Errorf("%s: %w", pluginCertFile, err)
	}
	if err := checkPluginTrustDomain(cert, td); err != nil {
		return fmt.Errorf("%s: %w", pluginCertFile, err)
	}
	return nil
}

// checkPluginChainOrder checks that the chain starts with cert and that
// each certificate is issued by the next. Workloads receive cert-chain.pem
// as it is, after their leaf; a shuffled chain verifies here (pools ignore
// order) yet breaks peers that expect each certificate to be followed by
// its issuer.
func checkPluginChainOrder(cert *x509.Certificate, chain []*x509.Certificate) error {
	if !bytes.Equal(chain[0].Raw, cert.Raw) {
		return fmt.Errorf("%s: first certificate is not the one in %s", pluginChainFile, pluginCertFile)
	}
	for i := 1; i < len(chain); i++ {
		if err := chain[i-1].CheckSignatureFrom(chain[i]); err != nil {
			return fmt.Errorf("%s: certificate %d is not issued by certificate %d: %w", pluginChainFile, i, i+1, err)
		}
	}
	return nil
}

// checkPluginRoots checks each root: a CA with a strong enough key, of
// trust domain td.
func checkPluginRoots(roots []*x509.Certificate, td spiffeid.TrustDomain) error {
	for i, r := range roots {
		if err := checkPluginCA(r); err != nil {
			return fmt.Errorf("%s: certificate %d: %w", pluginRootFile, i+1, err)
		}
		if err := checkPluginPublicKey(r.PublicKey); err != nil {
			return fmt.Errorf("%s: certificate %d: %w", pluginRootFile, i+1, err)
		}
		// A root of another trust domain must not vouch for our workloads.
		if err := checkPluginTrustDomain(r, td); err != nil {
			return fmt.Errorf("%s: certificate %d: %w", pluginRootFile, i+1, err)
		}
	}
	return nil
}

// pluginIntermediates are the certificates of the chain between the
// signing certificate and the roots, each checked (key strength, trust
// domain td); roots the chain includes were checked as roots.
func pluginIntermediates(chain, roots []*x509.Certificate, td spiffeid.TrustDomain) ([]*x509.Certificate, error) {
	var intermediates []*x509.Certificate
	for i, c := range chain[1:] {
		if pluginContainsCert(roots, c) {
			continue // checked as a root
		}
		if err := checkPluginPublicKey(c.PublicKey); err != nil {
			return nil, fmt.Errorf("%s: certificate %d: %w", pluginChainFile, i+2, err)
		}
		if err := checkPluginTrustDomain(c, td); err != nil {
			return nil, fmt.Errorf("%s: certificate %d: %w", pluginChainFile, i+2, err)
		}
		intermediates = append(intermediates, c)
	}
	return intermediates, nil
}

// pluginKeyWarnings warns of a key file in dir that group or others can
// read (keyMode), nil when none can.
func pluginKeyWarnings(dir string, keyMode fs.FileMode) []string {
	perm := keyMode.Perm()
	if perm&0o077 == 0 {
		return nil
	}
	return []string{fmt.Sprintf(
		"%s is readable by group or others (mode %#o); restrict it to 0600 (for a Kubernetes secret volume, set defaultMode 0400)",
		filepath.Join(dir, pluginKeyFile), perm)}
}

// verify holds the checks whose outcome depends on the time, so a watcher
// can repeat them on unchanged files.
func (m *PluginMaterial) verify(now time.Time) error {
	// x509 verification would refuse these too, but without saying which
	// certificate and when.
	if now.Before(m.Cert.NotBefore) {
		return fmt.Errorf("%s: not valid before %s", pluginCertFile, m.Cert.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(m.Cert.NotAfter) {
		return fmt.Errorf("%s: expired at %s", pluginCertFile, m.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	opts := x509.VerifyOptions{
		Roots:         x509.NewCertPool(),
		Intermediates: x509.NewCertPool(),
		CurrentTime:   now,
		// Istio signing certificates rarely carry extended key usages;
		// the leaves decide their own.
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}
	for _, r := range m.Roots {
		opts.Roots.AddCert(r)
	}
	for _, c := range m.Intermediates {
		opts.Intermediates.AddCert(c)
	}
	if _, err := m.Cert.Verify(opts); err != nil {
		return fmt.Errorf("%s does not chain to %s through %s: %w", pluginCertFile, pluginRootFile, pluginChainFile, err)
	}
	return nil
}

// pluginCerts decodes a file of one or more CERTIFICATE blocks.
func pluginCerts(name string, data []byte) ([]*x509.Certificate, error) {
	certs, err := pemfile.ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return certs, nil
}

// pluginKey decodes ca-key.pem in the forms Istio's tools and openssl
// write.
func pluginKey(data []byte) (crypto.Signer, error) {
	key, err := pemfile.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pluginKeyFile, err)
	}
	return key, nil
}

func checkPluginCA(c *x509.Certificate) error {
	if !c.BasicConstraintsValid || !c.IsCA {
		return errors.New("not a CA certificate (basic constraints CA:TRUE missing)")
	}
	if c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return errors.New("key usage lacks keyCertSign")
	}
	return nil
}

func checkPluginPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < 2048 {
			return fmt.Errorf("RSA key of %d bits is too weak, want at least 2048", n)
		}
	case *ecdsa.PublicKey:
		if n := k.Curve.Params().BitSize; n < 256 {
			return fmt.Errorf("EC key on %s is too weak, want P-256 or larger", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return fmt.Errorf("unsupported public key type %T", pub)
	}
	return nil
}

// checkPluginTrustDomain accepts certificates without SPIFFE IDs: Istio's
// roots and intermediates carry none.
func checkPluginTrustDomain(c *x509.Certificate, td spiffeid.TrustDomain) error {
	for _, u := range c.URIs {
		if !strings.EqualFold(u.Scheme, "spiffe") {
			continue
		}
		id, err := spiffeid.FromURI(u)
		if err != nil {
			return fmt.Errorf("URI SAN %q: %w", u, err)
		}
		if id.TrustDomain() != td {
			return fmt.Errorf("URI SAN %q is in trust domain %q, want %q", u, id.TrustDomain().Name(), td.Name())
		}
	}
	return nil
}

func pluginContainsCert(certs []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range certs {
		if bytes.Equal(x.Raw, c.Raw) {
			return true
		}
	}
	return false
}

// PluginWatcher keeps the plug-in CA material of a directory current. It
// polls rather than using inotify: Kubernetes updates secret volumes by
// swapping a "..data" symlink, which watches on the files miss, and a few
// kilobytes read every few seconds cost nothing.
type PluginWatcher struct {
	dir      string
	td       spiffeid.TrustDomain
	clk      clock.WithTicker
	interval time.Duration
	logger   *slog.Logger
	// readFiles is readPluginFiles; tests replace it to play a writer
	// racing the reader.
	readFiles func(dir string) (*pluginFiles, error)

	r *fileutil.Reloader[*pluginFiles, *PluginMaterial]
}

// NewPluginWatcher returns a watcher of dir for trust domain td. A
// non-positive interval means DefaultPluginPollInterval; a nil clk the
// real clock; a nil logger discards.
func NewPluginWatcher(dir string, td spiffeid.TrustDomain, clk clock.WithTicker, interval time.Duration, logger *slog.Logger) *PluginWatcher {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if interval <= 0 {
		interval = DefaultPluginPollInterval
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w := &PluginWatcher{
		dir:       dir,
		td:        td,
		clk:       clk,
		interval:  interval,
		logger:    logger.With("ca_dir", dir),
		readFiles: readPluginFiles,
	}
	w.r = fileutil.NewReloader(fileutil.ReloaderConfig[*pluginFiles, *PluginMaterial]{
		Read:   func() (*pluginFiles, error) { return readPluginSnapshot(w.dir, w.readFiles) },
		Digest: func(f *pluginFiles) fileutil.Digest { return f.digest },
		Parse:  w.apply,
		// Unchanged files need no parsing, but time alone can expire
		// them, and /readyz should say so.
		Verify: func(cur *PluginMaterial) error { return cur.verify(w.clk.Now()) },
		Wrap:   func(err error) error { return fmt.Errorf("ca: plug-in CA directory %s: %w", w.dir, err) },
		Refused: func(err error) {
			w.logger.Error("plug-in CA material invalid; keeping the last good material", logattr.Error, err)
		},
		Changing: func(error) {
			w.logger.Debug("plug-in CA files changing; checking again next interval")
		},
		LoadAttempts: pluginLoadAttempts,
	})
	return w
}

// load reads the directory for the first time. An error means the server
// must not start.
func (w *PluginWatcher) load() error { return w.r.Load() }

// current is the last good material: never nil once load succeeded.
func (w *PluginWatcher) current() *PluginMaterial {
	m, _ := w.r.Current()
	return m
}

// lastError is the outcome of the most recent check: nil when it loaded
// new material or the files were unchanged and still valid.
func (w *PluginWatcher) lastError() error { return w.r.LastError() }

// changes is signalled (coalesced) whenever current changes.
func (w *PluginWatcher) changes() <-chan struct{} { return w.r.Changes() }

// run checks the directory every interval until ctx is done.
func (w *PluginWatcher) run(ctx context.Context) error {
	return w.r.Run(ctx, w.clk, w.interval)
}

// Check reads the directory once, as run does each interval; cmd may call
// it on SIGHUP. Files caught mid-update are left for the next check. An
// invalid change keeps the last good material and is returned, logged and
// kept for lastError (and the CA's Ready).
func (w *PluginWatcher) Check() error { return w.r.Check() }

// apply validates files and returns the material they hold. Refused files
// are validated again at every check, as material that is not valid yet
// may become so without changing.
func (w *PluginWatcher) apply(files *pluginFiles, _ *PluginMaterial, _ bool) (*PluginMaterial, error) {
	m, warnings, err := validatePlugin(files, w.dir, w.td, w.clk.Now())
	if err != nil {
		return nil, err
	}
	for _, warning := range warnings {
		w.logger.Warn(warning)
	}
	w.logger.Info("plug-in CA material loaded",
		"subject", m.Cert.Subject.String(),
		"not_after", m.Cert.NotAfter,
		"intermediates", len(m.Intermediates),
		"roots", len(m.Roots),
		"digest", hex.EncodeToString(m.Digest[:8]))
	return m, nil
}
