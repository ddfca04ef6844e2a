package caclient

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
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/internal/svidcheck"
)

// Request is what one CreateCertificate asks for.
type Request struct {
	// Key is the workload key the CSR is signed with (required).
	Key crypto.Signer
	// ID, when not zero, is put in the CSR; the server refuses it unless
	// it is the identity the caller authenticates as.
	ID spiffeid.ID
	// DNSNames are put in the CSR beside ID. The server refuses them
	// unless it decides them too: a node agent's, impersonating a workload
	// its identity map gives them.
	DNSNames []string
	// TTL is the lifetime to ask for, in whole seconds; zero leaves it to
	// the server.
	TTL time.Duration
	// Token, when not empty, is sent as a bearer token (only over TLS).
	Token string
	// Impersonate, when not zero, asks for the certificate of that
	// workload rather than the caller's own: Istio's ImpersonatedIdentity,
	// which a node proxy or node agent sends and the server grants only to
	// trusted node accounts for pods of their node.
	Impersonate spiffeid.ID
}

// ImpersonatedIdentity is the request metadata key of Request.Impersonate,
// as Istio's node proxies send it.
const ImpersonatedIdentity = "ImpersonatedIdentity"

// CreateCertificate sends one CreateCertificate to addr over a connection
// configured by tlsCfg (ServerTLS, plus a client certificate to
// authenticate with one) and returns the certificates of the answer in
// order. An element with several PEM certificates (Istio's own CA sends
// intermediates that way) counts as each of them. A failed call returns
// the gRPC status error unwrapped, for status.FromError.
func CreateCertificate(ctx context.Context, addr string, tlsCfg *tls.Config, req Request) ([]*x509.Certificate, error) {
	if req.Key == nil {
		return nil, errors.New("caclient: no key for the CSR")
	}
	tmpl := &x509.CertificateRequest{DNSNames: req.DNSNames}
	if !req.ID.IsZero() {
		tmpl.URIs = []*url.URL{req.ID.URL()}
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, tmpl, req.Key)
	if err != nil {
		return nil, fmt.Errorf("create CSR: %w", err)
	}
	msg := &securityv1alpha1.IstioCertificateRequest{
		Csr:              string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER})),
		ValidityDuration: int64(req.TTL / time.Second),
	}
	if !req.Impersonate.IsZero() {
		if msg.Metadata, err = structpb.NewStruct(map[string]any{ImpersonatedIdentity: req.Impersonate.String()}); err != nil {
			return nil, err
		}
	}
	tlsCfg, mismatch := keepTrustDomainRefusal(tlsCfg)
	conn, err := Dial(addr, tlsCfg, req.Token)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, msg)
	if err != nil {
		if refusal := mismatch.Load(); refusal != nil {
			// gRPC reports a failed handshake as Unavailable, which
			// callers retry; this one no retry mends.
			return nil, *refusal
		}
		return nil, err
	}
	var chain []*x509.Certificate
	for i, p := range resp.GetCertChain() {
		certs, err := ParsePEMCerts([]byte(p))
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

// keepTrustDomainRefusal returns a copy of tlsCfg that keeps the last
// ErrServerTrustDomain its VerifyConnection returned, which gRPC passes
// on as text only.
func keepTrustDomainRefusal(tlsCfg *tls.Config) (*tls.Config, *atomic.Pointer[error]) {
	kept := &atomic.Pointer[error]{}
	verify := tlsCfg.VerifyConnection
	if verify == nil {
		return tlsCfg, kept
	}
	tlsCfg = tlsCfg.Clone()
	tlsCfg.VerifyConnection = func(cs tls.ConnectionState) error {
		err := verify(cs)
		if errors.Is(err, ErrServerTrustDomain) {
			kept.Store(&err)
		}
		return err
	}
	return tlsCfg, kept
}

// KeepaliveTime is how often a client pings the server while a call is
// open; the server's enforcement policy must allow it.
const KeepaliveTime = 30 * time.Second

// Dial returns a client connection to the certificate service at addr
// over TLS configured by tlsCfg, sending token, when not empty, as a
// bearer token on every call. Close it when done. Keepalive pings (every
// 30s while a call is open, so only long streams send them; the server
// allows every 10s) find a dead server under an idle WatchBundles stream.
func Dial(addr string, tlsCfg *tls.Config, token string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: 10 * time.Second}),
	}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(BearerToken(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("--ca-addr %q: %w", addr, err)
	}
	return conn, nil
}

// BearerToken is gRPC per-RPC credentials sending "authorization: Bearer
// <token>", only over TLS.
type BearerToken string

// GetRequestMetadata returns the authorization header.
func (b BearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is true: a token never travels in clear.
func (BearerToken) RequireTransportSecurity() bool { return true }

// CheckIssued takes the chain to present out of the answer (LeafChain:
// the leaf and intermediates; the roots the CA appended after them are
// ignored, since a flat list cannot say which trust domain each belongs
// to) and checks that the leaf is an X509-SVID
// of td for key, chaining to local, td's own roots (from the server's
// ROOTCA, FetchTrust), and for want when set, with svidcheck.Verify, the
// check every X509-SVID in trustbridge goes through. opts go to
// x509svid.Verify (x509svid.WithTime for an injected clock).
func CheckIssued(chain []*x509.Certificate, key crypto.Signer, td spiffeid.TrustDomain, want spiffeid.ID, local []*x509.Certificate, opts ...x509svid.VerifyOption) (id spiffeid.ID, err error) {
	if len(chain) == 0 {
		return id, errors.New("no certificates")
	}
	leafChain := LeafChain(chain)
	if len(local) == 0 {
		return id, fmt.Errorf("no roots of %s to verify the certificate with", td.Name())
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leafChain[0].PublicKey) {
		return id, errors.New("the certificate is not for the key this request sent")
	}
	// Any usage: the leaf serves the workload as client and server alike.
	id, _, err = svidcheck.Verify(leafChain, x509bundle.FromX509Authorities(td, local), x509.ExtKeyUsageAny, opts...)
	if err != nil {
		return id, err
	}
	if !want.IsZero() && id != want {
		return id, fmt.Errorf("issued %s, asked for %s", id, want)
	}
	return id, nil
}

// LeafChain is the part of a CA's answer to present: the leaf and the
// intermediates, up to the first self-signed certificate after the leaf.
func LeafChain(chain []*x509.Certificate) []*x509.Certificate {
	for i, c := range chain {
		if i > 0 && IsSelfSigned(c) {
			return chain[:i]
		}
	}
	return chain
}

// IsSelfSigned reports whether c is a CA certificate that signed itself.
func IsSelfSigned(c *x509.Certificate) bool {
	return c.IsCA && bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil
}
