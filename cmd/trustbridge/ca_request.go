package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/cappedfile"
)

// Size caps of the files `ca request` reads.
const (
	maxTokenFileSize = authn.MaxTokenSize + 1024 // room for surrounding whitespace
	maxPEMFileSize   = 1 << 20
)

type caRequestOptions struct {
	addr      string
	rootCert  string
	tokenFile string
	certDir   string
	out       string
	spiffeID  string
	serverID  string
	ttl       time.Duration
	keyType   string
	timeout   time.Duration
}

func newCARequestCmd(e env) *cobra.Command {
	var o caRequestOptions
	cmd := &cobra.Command{
		Use:   "request --ca-addr ADDR --root-cert FILE (--token-file FILE | --cert-dir DIR) --out DIR",
		Short: "Obtain a workload certificate from a running server's certificate service (bootstrap a VM, renew)",
		Long: `Generate a key locally and ask the certificate service of a running trustbridge
(--grpc-listen) for an X509-SVID, writing key.pem (mode 0600), cert-chain.pem
(leaf first) and root-cert.pem (the roots the server hands out) into --out.

The server decides the identity from how the caller authenticates, never from
the request: with --token-file, a bootstrap token (--bootstrap-token-file on
the server) or a Kubernetes service account token; with --cert-dir, the
certificate in cert-chain.pem and key.pem, as written by this command or
'ca issue', which renews it.

--root-cert is the trust for the connection: the server must present an
X509-SVID for --server-spiffe-id that chains to these roots. 'trustbridge
bundle inspect --format pem' of a fetched bundle, or the root-cert.pem of an
earlier run, produces it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCARequest(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addr, "ca-addr", "", "address of the certificate service, host:port (required)")
	f.StringVar(&o.rootCert, "root-cert", "", "PEM roots of the server's trust domain, to verify the server (required)")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding a bearer token (bootstrap token or Kubernetes service account token)")
	f.StringVar(&o.certDir, "cert-dir", "", "directory holding cert-chain.pem and key.pem: authenticate with that certificate (renewal)")
	f.StringVar(&o.out, "out", "", "directory to write key.pem, cert-chain.pem and root-cert.pem into (required; may be --cert-dir)")
	f.StringVar(&o.spiffeID, "spiffe-id", "", "SPIFFE ID to put in the CSR; the server refuses it unless it is the identity you authenticate as")
	f.StringVar(&o.serverID, "server-spiffe-id", "", "SPIFFE ID the server must present (default spiffe://<trust-domain>"+grpcServingPath+")")
	f.DurationVar(&o.ttl, "ttl", 0, "certificate lifetime to ask for (default: the server's --workload-ttl)")
	f.StringVar(&o.keyType, "key-type", string(ca.KeyECP256), "workload key type: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "deadline for the whole request")
	return cmd
}

func runCARequest(ctx context.Context, e env, o caRequestOptions) error {
	if o.addr == "" || o.rootCert == "" || o.out == "" {
		return errors.New("--ca-addr, --root-cert and --out are required")
	}
	if (o.tokenFile == "") == (o.certDir == "") {
		return errors.New("give exactly one of --token-file (bootstrap or service account token) and --cert-dir (renew with an issued certificate)")
	}
	if o.ttl < 0 || o.ttl%time.Second != 0 {
		return fmt.Errorf("--ttl %s: want a whole, positive number of seconds", o.ttl)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %s must be positive", o.timeout)
	}
	kt, err := ca.ParseKeyType(o.keyType)
	if err != nil {
		return fmt.Errorf("--key-type: %w", err)
	}
	var want spiffeid.ID
	if o.spiffeID != "" {
		if want, err = spiffeid.FromString(o.spiffeID); err != nil {
			return fmt.Errorf("--spiffe-id %q: %w", o.spiffeID, err)
		}
	}
	roots, err := readPEMCerts(o.rootCert)
	if err != nil {
		return fmt.Errorf("--root-cert: %w", err)
	}

	var (
		clientCert *tls.Certificate
		token      string
	)
	if o.certDir != "" {
		var id spiffeid.ID
		if clientCert, id, err = loadCertDir(o.certDir, e.now()); err != nil {
			return fmt.Errorf("--cert-dir: %w", err)
		}
		if want.IsZero() {
			want = id // renewal keeps the identity
		}
	} else if token, err = readToken(o.tokenFile); err != nil {
		return fmt.Errorf("--token-file: %w", err)
	}

	serverID, err := expectedServerID(o.serverID, roots, want)
	if err != nil {
		return err
	}
	td := serverID.TrustDomain()
	if !want.IsZero() && !want.MemberOf(td) {
		return fmt.Errorf("--spiffe-id %s is not in the server's trust domain %s", want, td.Name())
	}

	key, err := ca.GenerateKey(kt)
	if err != nil {
		return err
	}
	tmpl := &x509.CertificateRequest{}
	if !want.IsZero() {
		tmpl.URIs = []*url.URL{want.URL()}
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return fmt.Errorf("create CSR: %w", err)
	}

	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	chain, err := callCA(ctx, o.addr, serverTLS(roots, serverID, clientCert), token, &securityv1alpha1.IstioCertificateRequest{
		Csr:              string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER})),
		ValidityDuration: int64(o.ttl / time.Second),
	})
	if err != nil {
		return requestError(o.addr, o.timeout, err)
	}
	leafChain, issuedRoots, id, err := checkIssued(chain, key, td, want)
	if err != nil {
		return fmt.Errorf("the CA at %s answered with an unusable certificate: %w", o.addr, err)
	}
	if err := writeCredentials(o.out, key, leafChain, issuedRoots); err != nil {
		return err
	}
	fmt.Fprintf(e.out, "issued %s, valid until %s\n  %s\n", id, leafChain[0].NotAfter.UTC().Format(time.RFC3339), o.out)
	return nil
}

// expectedServerID is --server-spiffe-id, or else the certificate
// service's ID in the trust domain of the identity requested (--spiffe-id,
// or the certificate of --cert-dir), or else in the one trust domain the
// roots name in their spiffe://<td> URI SAN, as trustbridge's roots do.
func expectedServerID(flag string, roots []*x509.Certificate, want spiffeid.ID) (spiffeid.ID, error) {
	if flag != "" {
		id, err := spiffeid.FromString(flag)
		if err != nil {
			return id, fmt.Errorf("--server-spiffe-id %q: %w", flag, err)
		}
		return id, nil
	}
	named, anonymous := rootTrustDomains(roots)
	td := want.TrustDomain()
	switch {
	case !td.IsZero():
		if !anonymous && !slices.Contains(named, td) {
			return spiffeid.ID{}, fmt.Errorf("--root-cert holds roots of %s, not of %s, the trust domain of %s", joinTDs(named), td.Name(), want)
		}
	case len(named) == 1:
		td = named[0]
	case len(named) > 1:
		return spiffeid.ID{}, fmt.Errorf("--root-cert holds roots of several trust domains (%s); pass --spiffe-id or --server-spiffe-id", joinTDs(named))
	default:
		return spiffeid.ID{}, errors.New("cannot tell the server's trust domain: --root-cert names none; pass --server-spiffe-id or --spiffe-id")
	}
	return spiffeid.RequireFromPath(td, grpcServingPath), nil
}

// rootTrustDomains lists the trust domains roots name in a spiffe://<td>
// URI SAN, and whether some root names none.
func rootTrustDomains(roots []*x509.Certificate) (named []spiffeid.TrustDomain, anonymous bool) {
	for _, r := range roots {
		td, ok := rootTrustDomain(r)
		switch {
		case !ok:
			anonymous = true
		case !slices.Contains(named, td):
			named = append(named, td)
		}
	}
	return named, anonymous
}

func rootTrustDomain(r *x509.Certificate) (spiffeid.TrustDomain, bool) {
	if len(r.URIs) != 1 {
		return spiffeid.TrustDomain{}, false
	}
	id, err := spiffeid.FromURI(r.URIs[0])
	if err != nil || id.Path() != "" {
		return spiffeid.TrustDomain{}, false
	}
	return id.TrustDomain(), true
}

// rootsFor keeps the roots that may vouch for td. Roots of other trust
// domains, which a merged root-cert.pem holds too, must not. When some
// roots name td (trustbridge's own always do), only those vouch: a
// federated root naming no trust domain could otherwise mint td's server
// identity. Only when none names td (a plug-in CA's roots often do not)
// do the roots naming no trust domain vouch; merged trust that mixes such
// roots of several trust domains cannot be told apart, so give a
// --root-cert of the local roots alone then.
func rootsFor(td spiffeid.TrustDomain, roots []*x509.Certificate) []*x509.Certificate {
	var named, anonymous []*x509.Certificate
	for _, r := range roots {
		switch other, ok := rootTrustDomain(r); {
		case !ok:
			anonymous = append(anonymous, r)
		case other == td:
			named = append(named, r)
		}
	}
	if len(named) > 0 {
		return named
	}
	return anonymous
}

func joinTDs(tds []spiffeid.TrustDomain) string {
	names := make([]string, len(tds))
	for i, td := range tds {
		names[i] = td.Name()
	}
	return strings.Join(names, ", ")
}

// serverTLS verifies the server as an X509-SVID for serverID against
// roots, on every handshake; host names play no part.
func serverTLS(roots []*x509.Certificate, serverID spiffeid.ID, clientCert *tls.Certificate) *tls.Config {
	bundle := x509bundle.FromX509Authorities(serverID.TrustDomain(), rootsFor(serverID.TrustDomain(), roots))
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// crypto/tls's own verification checks a host name; it is
		// replaced by VerifyConnection, which also runs on resumption.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection as an X509-SVID
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, _, err := x509svid.Verify(cs.PeerCertificates, bundle)
			if err != nil {
				return fmt.Errorf("server certificate does not verify against --root-cert: %w", err)
			}
			if id != serverID {
				return fmt.Errorf("server is %s, want %s (see --server-spiffe-id)", id, serverID)
			}
			return nil
		},
	}
	if clientCert != nil {
		cfg.Certificates = []tls.Certificate{*clientCert}
	}
	return cfg
}

// callCA sends one CreateCertificate and returns the certificates of the
// answer in order. An element with several PEM certificates (Istio's own
// CA sends intermediates that way) counts as each of them.
func callCA(ctx context.Context, addr string, tlsCfg *tls.Config, token string, req *securityv1alpha1.IstioCertificateRequest) ([]*x509.Certificate, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerToken(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("--ca-addr %q: %w", addr, err)
	}
	defer conn.Close()
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, req)
	if err != nil {
		return nil, err
	}
	var chain []*x509.Certificate
	for i, p := range resp.GetCertChain() {
		certs, err := parsePEMCerts([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("cert_chain element %d: %w", i, err)
		}
		chain = append(chain, certs...)
	}
	if len(chain) == 0 {
		return nil, errors.New("the CA answered with an empty cert_chain")
	}
	return chain, nil
}

// bearerToken sends "authorization: Bearer <token>", only over TLS.
type bearerToken string

func (b bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return true }

// requestError says what a failed call means for the person running it.
func requestError(addr string, timeout time.Duration, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unauthenticated:
		return fmt.Errorf("the CA at %s did not accept the credentials (token or certificate): %s", addr, msg)
	case codes.PermissionDenied:
		return fmt.Errorf("the CA at %s refused to issue this identity: %s", addr, msg)
	case codes.InvalidArgument:
		return fmt.Errorf("the CA at %s refused the request: %s", addr, msg)
	case codes.ResourceExhausted:
		return fmt.Errorf("the CA at %s is busy or rate-limits this identity; retry later: %s", addr, msg)
	case codes.Unavailable:
		return fmt.Errorf("cannot get a certificate from %s (is the server running with --grpc-listen, and does --root-cert hold its roots?): %s", addr, msg)
	case codes.DeadlineExceeded:
		return fmt.Errorf("no answer from the CA at %s within --timeout %s: %s", addr, timeout, msg)
	}
	return fmt.Errorf("the CA at %s: %s: %s", addr, st.Code(), msg)
}

// checkIssued splits the answer into the chain to present (the leaf and
// intermediates, up to the first self-signed certificate) and the roots
// after it, and checks that the leaf is an X509-SVID of td for our key,
// chaining to those roots, and for want when set.
func checkIssued(chain []*x509.Certificate, key crypto.Signer, td spiffeid.TrustDomain, want spiffeid.ID) (leafChain, roots []*x509.Certificate, id spiffeid.ID, err error) {
	n := len(chain)
	for i, c := range chain {
		if i > 0 && isSelfSigned(c) {
			n = i
			break
		}
	}
	leafChain, roots = chain[:n], chain[n:]
	if len(roots) == 0 {
		return nil, nil, id, errors.New("no roots after the certificate chain")
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leafChain[0].PublicKey) {
		return nil, nil, id, errors.New("the certificate is not for the key this request sent")
	}
	id, _, err = x509svid.Verify(leafChain, x509bundle.FromX509Authorities(td, rootsFor(td, roots)))
	if err != nil {
		return nil, nil, id, err
	}
	if !want.IsZero() && id != want {
		return nil, nil, id, fmt.Errorf("issued %s, asked for %s", id, want)
	}
	return leafChain, roots, id, nil
}

func isSelfSigned(c *x509.Certificate) bool {
	return c.IsCA && bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil
}

// writeCredentials writes the files `ca issue` writes: key.pem (0600),
// cert-chain.pem (leaf first, no roots) and root-cert.pem.
func writeCredentials(dir string, key crypto.Signer, chain, roots []*x509.Certificate) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{"key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600},
		{"cert-chain.pem", certsPEM(chain), 0o644},
		{"root-cert.pem", certsPEM(roots), 0o644},
	}
	// Every file is staged before any replaces its predecessor: when --out
	// is --cert-dir, a failure part-way must not leave a new key.pem next
	// to the old cert-chain.pem, a pair that no longer matches and cannot
	// renew. A symlink in --out is replaced, never written through.
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			return fmt.Errorf("%s is a directory", p)
		}
	}
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
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// stageFile writes data with perm to a new temporary file in dir, synced,
// and returns its path for a rename over name.
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

// loadCertDir loads cert-chain.pem and key.pem as a client certificate
// and returns its SPIFFE ID; an expired certificate is refused here
// rather than by the server, with advice.
func loadCertDir(dir string, now time.Time) (*tls.Certificate, spiffeid.ID, error) {
	chainPEM, err := readSmallFile(filepath.Join(dir, "cert-chain.pem"), maxPEMFileSize)
	if err != nil {
		return nil, spiffeid.ID{}, err
	}
	keyPEM, err := readSmallFile(filepath.Join(dir, "key.pem"), maxPEMFileSize)
	if err != nil {
		return nil, spiffeid.ID{}, err
	}
	cert, err := tls.X509KeyPair(chainPEM, keyPEM)
	if err != nil {
		return nil, spiffeid.ID{}, fmt.Errorf("%s: %w", dir, err)
	}
	id, err := x509svid.IDFromCert(cert.Leaf)
	if err != nil {
		return nil, spiffeid.ID{}, fmt.Errorf("%s/cert-chain.pem is not an X509-SVID: %w", dir, err)
	}
	if now.After(cert.Leaf.NotAfter) {
		return nil, spiffeid.ID{}, fmt.Errorf("the certificate for %s in %s expired at %s; bootstrap again with --token-file", id, dir, cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return &cert, id, nil
}

// readToken reads a bearer token file: surrounding whitespace (a trailing
// newline) is not part of the token.
func readToken(path string) (string, error) {
	data, err := readSmallFile(path, maxTokenFileSize)
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

func readPEMCerts(path string) ([]*x509.Certificate, error) {
	data, err := readSmallFile(path, maxPEMFileSize)
	if err != nil {
		return nil, err
	}
	certs, err := parsePEMCerts(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return certs, nil
}

// parsePEMCerts parses every CERTIFICATE block; there must be one.
func parsePEMCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs), err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificates")
	}
	return certs, nil
}

// readSmallFile reads at most limit bytes of a regular file.
func readSmallFile(path string, limit int64) ([]byte, error) {
	data, _, err := cappedfile.ReadFile(path, limit)
	return data, err
}
