package bundleserver

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"runtime"
	"time"

	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/pemfile"
)

const (
	// maxWebCertFileSize bounds what a misconfigured path (a log file, a
	// device) can make us read; real certificate files are kilobytes.
	maxWebCertFileSize = 1 << 20

	// webCertExpiryWarning is how close to NotAfter a loaded certificate
	// draws a warning: long enough for a human to act on it.
	webCertExpiryWarning = 7 * 24 * time.Hour

	// webCertLoadAttempts is how often Load re-reads a pair caught
	// mid-update: a Kubernetes secret update swaps one symlink, so the
	// next read is normally consistent.
	webCertLoadAttempts = 3

	// DefaultWebCertPollInterval is used when Run is given no positive
	// interval.
	DefaultWebCertPollInterval = 10 * time.Second
)

var (
	// errWebCertChanging reports that the files changed between two reads.
	errWebCertChanging = fileutil.ErrChanging
	// errWebCertMismatch reports a key that is not the leaf's: either a
	// writer is between the two files or the pair is wrong.
	errWebCertMismatch = errors.New("private key does not match the certificate")
)

// FileCertificate serves the https_web profile's certificate from a PEM
// certificate chain and a PEM private key on disk, re-read by polling so a
// renewed pair (cert-manager, a Kubernetes Secret, an operator's cp) is
// served without a restart. Polling rather than inotify: Kubernetes
// updates secret volumes by swapping a "..data" symlink, which watches on
// the files miss.
//
// The certificate must satisfy Web PKI clients (SPIFFE Federation
// §5.2.1): trustbridge cannot check that it chains to a public root, only
// that it is a usable server leaf.
type FileCertificate struct {
	certPath, keyPath string
	clk               clock.PassiveClock
	logger            *slog.Logger
	// read is readFiles; tests replace it to play a writer racing the
	// reader.
	read func() (*webCertFiles, error)

	r *fileutil.Reloader[*webCertFiles, *webCertState]

	// The fields below are the Reloader hooks' state, guarded by its lock.
	// mismatchSeen is set when the previous check found a key that is not
	// the leaf's; a second one in a row is an error.
	mismatchSeen bool
	// expiryWarned is the digest of the pair whose approaching expiry was
	// last logged.
	expiryWarned [32]byte
}

// webCertState is a validated pair. It is shared between handshakes and
// must not be modified.
type webCertState struct {
	cert   *tls.Certificate
	digest [32]byte
}

type webCertFiles struct {
	cert, key []byte
	keyMode   fs.FileMode
	digest    [32]byte
}

// NewFileCertificate returns a FileCertificate for the given files. It
// reads nothing until Load. A nil clk means the real clock; a nil logger
// discards.
func NewFileCertificate(certPath, keyPath string, clk clock.PassiveClock, logger *slog.Logger) *FileCertificate {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	f := &FileCertificate{
		certPath: certPath,
		keyPath:  keyPath,
		clk:      clk,
		logger:   logger.With("cert_file", certPath, "key_file", keyPath),
	}
	f.read = f.readFiles
	f.r = fileutil.NewReloader(fileutil.ReloaderConfig[*webCertFiles, *webCertState]{
		Read:   f.readChecked,
		Digest: func(files *webCertFiles) fileutil.Digest { return files.digest },
		Parse:  f.parse,
		// Unchanged files need no parsing, but time alone expires them,
		// and readiness checks should say so.
		Verify: f.verify,
		Wrap:   f.wrap,
		Refused: func(err error) {
			f.logger.Error("web certificate invalid; keeping the last good certificate", logattr.Error, err)
		},
		Changing: func(err error) {
			if !errors.Is(err, errWebCertMismatch) {
				f.logger.Debug("web certificate files changing; checking again next interval")
			}
		},
		LoadAttempts: webCertLoadAttempts,
	})
	return f
}

// Load reads the pair for the first time. An error means the server must
// not start: there is no earlier certificate to fall back on.
func (f *FileCertificate) Load() error { return f.r.Load() }

// Check reads the pair once, as Run does each interval; cmd may call it
// on SIGHUP. A changed, valid pair is served from the next handshake on.
// Files caught mid-update, and a key that does not match the certificate
// once, are left for the next check: writers that are not atomic replace
// one file, then the other. An invalid change keeps the last good pair and
// is returned, logged once and kept in LastError.
func (f *FileCertificate) Check() error { return f.r.Check() }

// Run checks the files every interval (DefaultWebCertPollInterval if not
// positive) until ctx is done. It is meant to follow a successful Load;
// problems are logged and kept in LastError, never returned.
func (f *FileCertificate) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultWebCertPollInterval
	}
	return f.r.Run(ctx, clock.RealClock{}, interval)
}

// GetCertificate is a tls.Config.GetCertificate hook serving the last
// good pair whatever the client asked for: this endpoint has one name.
func (f *FileCertificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if cur, ok := f.r.Current(); ok {
		return cur.cert, nil
	}
	return nil, errors.New("bundleserver: no web certificate loaded")
}

// LastError is the outcome of the most recent Load or Check: nil when it
// loaded a new pair or the files were unchanged and still valid.
func (f *FileCertificate) LastError() error { return f.r.LastError() }

func (f *FileCertificate) wrap(err error) error {
	return fmt.Errorf("bundleserver: web certificate (cert %s, key %s): %w", f.certPath, f.keyPath, err)
}

// readChecked is readSnapshot for the Reloader: a failure to read is a
// check that did not find a mismatch.
func (f *FileCertificate) readChecked() (*webCertFiles, error) {
	files, err := f.readSnapshot()
	if err != nil && !errors.Is(err, errWebCertChanging) {
		f.mismatchSeen = false
	}
	return files, err
}

// verify checks the pair in force, whose files did not change, again.
func (f *FileCertificate) verify(cur *webCertState) error {
	f.mismatchSeen = false
	return f.checkTimeLocked(cur.cert.Leaf, cur.digest)
}

// parse validates files and returns the certificate to serve. Refused
// files are validated again at every check, as a certificate that is not
// valid yet may become so without changing. A key that does not match
// the certificate is a writer mid-update the first time while a pair is
// served.
func (f *FileCertificate) parse(files *webCertFiles, _ *webCertState, serving bool) (*webCertState, error) {
	cert, err := f.apply(files)
	if errors.Is(err, errWebCertMismatch) && serving && !f.mismatchSeen {
		f.mismatchSeen = true
		f.logger.Debug("web certificate key does not match; assuming a writer is mid-update, checking again next interval")
		return nil, fmt.Errorf("%w: %w", fileutil.ErrChanging, err)
	}
	if !errors.Is(err, errWebCertMismatch) {
		f.mismatchSeen = false
	}
	return cert, err
}

func (f *FileCertificate) apply(files *webCertFiles) (*webCertState, error) {
	cert, warnings, err := parseWebCert(files)
	if err != nil {
		return nil, err
	}
	if err := f.checkTimeLocked(cert.Leaf, files.digest); err != nil {
		return nil, err
	}
	for _, w := range warnings {
		f.logger.Warn("web certificate loaded with a warning", logattr.Warning, w)
	}
	leaf := cert.Leaf
	f.logger.Info("web certificate loaded",
		"subject", leaf.Subject.String(),
		"dns_names", leaf.DNSNames,
		"issuer", leaf.Issuer.String(),
		"serial", leaf.SerialNumber.Text(16),
		"not_after", leaf.NotAfter,
		"chain_length", len(cert.Certificate),
		"digest", hex.EncodeToString(files.digest[:8]))
	return &webCertState{cert: cert, digest: files.digest}, nil
}

// checkTimeLocked refuses a leaf outside its validity and warns, once per
// pair, when it is about to expire.
func (f *FileCertificate) checkTimeLocked(leaf *x509.Certificate, digest [32]byte) error {
	now := f.clk.Now()
	if now.Before(leaf.NotBefore) {
		return fmt.Errorf("certificate is not valid until %s", leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(leaf.NotAfter) {
		return fmt.Errorf("certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if left := leaf.NotAfter.Sub(now); left < webCertExpiryWarning && f.expiryWarned != digest {
		f.expiryWarned = digest
		f.logger.Warn("web certificate expires soon; replace it",
			"not_after", leaf.NotAfter, "remaining", left.Round(time.Minute).String())
	}
	return nil
}

// readSnapshot reads both files twice: a pair that differs between the
// reads was caught mid-update, such as a certificate from the new secret
// and a key from the old one.
func (f *FileCertificate) readSnapshot() (*webCertFiles, error) {
	first, err := f.read()
	if err != nil {
		return nil, err
	}
	second, err := f.read()
	if err != nil {
		return nil, err
	}
	if first.digest != second.digest {
		return nil, errWebCertChanging
	}
	return first, nil
}

func (f *FileCertificate) readFiles() (*webCertFiles, error) {
	cert, _, err := readWebCertFile(f.certPath)
	if err != nil {
		return nil, fmt.Errorf("certificate file: %w", err)
	}
	key, mode, err := readWebCertFile(f.keyPath)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	h := sha256.New()
	// Length-prefix the certificate so no split of the same bytes between
	// the two files hashes alike.
	_ = binary.Write(h, binary.BigEndian, uint64(len(cert)))
	h.Write(cert)
	h.Write(key)
	files := &webCertFiles{cert: cert, key: key, keyMode: mode}
	h.Sum(files.digest[:0])
	return files, nil
}

func readWebCertFile(path string) ([]byte, fs.FileMode, error) {
	return fileutil.ReadFile(path, maxWebCertFileSize)
}

// parseWebCert builds the served certificate and checks it is a usable
// TLS server leaf. Time is checked by the caller.
func parseWebCert(files *webCertFiles) (*tls.Certificate, []string, error) {
	if mismatched(files.cert, files.key) {
		return nil, nil, errWebCertMismatch
	}
	cert, err := tls.X509KeyPair(files.cert, files.key)
	if err != nil {
		return nil, nil, err
	}
	leaf := cert.Leaf
	if leaf == nil { // X509KeyPair sets it since Go 1.23; stay safe
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, nil, err
		}
		cert.Leaf = leaf
	}
	if leaf.IsCA {
		return nil, nil, fmt.Errorf("first certificate (%q) is a CA certificate; it must be the server's leaf certificate", leaf.Subject.String())
	}
	if !serverAuthAllowed(leaf) {
		return nil, nil, errors.New("certificate's extended key usage does not allow TLS server authentication")
	}

	var warnings []string
	if len(leaf.DNSNames) == 0 && len(leaf.IPAddresses) == 0 {
		warnings = append(warnings, "certificate has no DNS or IP subject alternative name; Web PKI clients will reject it")
	}
	chain := []*x509.Certificate{leaf}
	for i, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, nil, fmt.Errorf("certificate %d of the chain: %w", i+2, err)
		}
		chain = append(chain, c)
	}
	for i := 1; i < len(chain); i++ {
		if chain[i-1].CheckSignatureFrom(chain[i]) != nil {
			warnings = append(warnings, fmt.Sprintf("certificate %d of the chain did not issue certificate %d; clients may fail to build a chain", i+1, i))
		}
	}
	if runtime.GOOS != "windows" && files.keyMode.Perm()&0o077 != 0 {
		warnings = append(warnings, fmt.Sprintf("private key file mode %#o lets other users read it; use 0600 or 0400 (Kubernetes: defaultMode: 0400)", files.keyMode.Perm()))
	}
	return &cert, warnings, nil
}

// mismatched reports whether both PEM inputs parse on their own but the
// key is not the leaf's: the one failure that a writer between the two
// files explains. Only clean PEM files (pemfile's strict parsers) count:
// what tls.X509KeyPair tolerates beyond them fails at once instead.
func mismatched(certPEM, keyPEM []byte) bool {
	certs, err := pemfile.ParseCertificates(certPEM)
	if err != nil {
		return false
	}
	key, err := pemfile.ParsePrivateKey(keyPEM)
	if err != nil {
		return false
	}
	pub, ok := certs[0].PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && !pub.Equal(key.Public())
}

func serverAuthAllowed(leaf *x509.Certificate) bool {
	if len(leaf.ExtKeyUsage) == 0 && len(leaf.UnknownExtKeyUsage) == 0 {
		return true
	}
	for _, u := range leaf.ExtKeyUsage {
		if u == x509.ExtKeyUsageServerAuth || u == x509.ExtKeyUsageAny {
			return true
		}
	}
	return false
}
