// Package trustbridge is a ca.UpstreamAuthority that asks another
// trustbridge's certificate service (SignIntermediate) to sign this CA's
// intermediate: nested trust, a regional trustbridge under a corporate
// one. The upstream signs only for SPIFFE IDs in its --downstream-allow,
// proven by an X509-SVID of its trust domain: the downstream presents the
// certificate in Config.ProvCertDir, read again on every call so that an
// external renewer (trustbridge ca request --renew on a timer, or an
// agent) keeps it fresh. See docs/upstream-trustbridge.md.
package trustbridge

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/upstream"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// Bounds of an upstream's answer, untrusted input: a real chain is the
// intermediate and a few of the upstream's own, its roots a handful
// during a rotation.
const (
	MaxChainCerts = 8
	MaxRoots      = 32
	MaxCertSize   = 16 << 10
	// maxResponseSize bounds the whole answer.
	maxResponseSize = (MaxChainCerts + MaxRoots) * (MaxCertSize + 8)
)

// DefaultTimeout bounds one SignIntermediate call when Config.Timeout is
// zero.
const DefaultTimeout = 30 * time.Second

// Config configures a Client.
type Config struct {
	// Address is the upstream certificate service, host:port.
	Address string
	// Roots verify the upstream server (its trust domain's roots).
	Roots []*x509.Certificate
	// ServerID is the SPIFFE ID the upstream must present; zero means
	// spiffe://<trust domain>/trustbridge/ca of the trust domain of the
	// certificate in ProvCertDir (caclient.ExpectedServerID).
	ServerID spiffeid.ID
	// ProvCertDir holds cert-chain.pem and key.pem, an X509-SVID of the
	// upstream's trust domain whose ID is in its --downstream-allow. It is
	// read on every call.
	ProvCertDir string
	// Timeout bounds one call; zero means DefaultTimeout.
	Timeout time.Duration
	// Clock tells whether the certificate in ProvCertDir expired; nil is
	// the real clock.
	Clock clock.PassiveClock
}

// Client implements ca.UpstreamAuthority against a trustbridge upstream.
type Client struct {
	cfg Config
}

var _ ca.UpstreamAuthority = (*Client)(nil)

// New checks cfg. It connects to nothing: every SignIntermediate dials
// with the credentials of that moment.
func New(cfg Config) (*Client, error) {
	switch {
	case cfg.Address == "":
		return nil, errors.New("trustbridge upstream: no address; set --upstream-address host:port")
	case len(cfg.Roots) == 0:
		return nil, errors.New("trustbridge upstream: no roots to verify the upstream; set --upstream-root-cert to its trust domain's roots (PEM)")
	case cfg.ProvCertDir == "":
		return nil, errors.New("trustbridge upstream: no credentials; set --upstream-prov-cert DIR to a directory with cert-chain.pem and key.pem, an SVID the upstream allows (--downstream-allow)")
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("trustbridge upstream: timeout %s is negative", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Client{cfg: cfg}, nil
}

// String names the upstream for messages and status.
func (c *Client) String() string { return "trustbridge upstream " + c.cfg.Address }

// SignIntermediate sends csrDER to the upstream and returns its answer,
// parsed and bounded; the CA checks it again (ca.CheckUpstreamChain).
func (c *Client) SignIntermediate(ctx context.Context, csrDER []byte, ttl time.Duration) (*ca.UpstreamChain, error) {
	if ttl < 0 {
		return nil, fmt.Errorf("%s: lifetime %s is negative", c, ttl)
	}
	cert, id, err := caclient.LoadCertDir(c.cfg.ProvCertDir, c.cfg.Clock.Now())
	if err != nil {
		return nil, fmt.Errorf("%s: --upstream-prov-cert: %w", c, err)
	}
	serverID := c.cfg.ServerID
	if serverID.IsZero() {
		if serverID, err = caclient.ExpectedServerID(c.cfg.Roots, id); err != nil {
			return nil, fmt.Errorf("%s: %w", c, err)
		}
	}
	conn, err := caclient.Dial(c.cfg.Address, caclient.ServerTLS(c.cfg.Roots, serverID, cert), "")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, err := identityapi.NewIdentityServiceClient(conn).SignIntermediate(ctx, &identityapi.SignIntermediateRequest{
		Csr: csrDER, TtlSeconds: int64((ttl + time.Second - 1) / time.Second),
	}, grpc.MaxCallRecvMsgSize(maxResponseSize))
	if err != nil {
		return nil, c.callError(id, err)
	}
	chain, err := ParseResponse(resp)
	if err != nil {
		return nil, upstream.Refused(fmt.Errorf("%s answered badly: %w", c, err))
	}
	return chain, nil
}

// callError says why the upstream refused, and what to do. An answer
// that asking again will not change (a denied identity, a service that
// signs no intermediates) is a refusal (upstream.Refused); an
// unreachable or busy upstream is not.
func (c *Client) callError(id spiffeid.ID, err error) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.PermissionDenied:
		return upstream.Refused(fmt.Errorf("upstream trustbridge at %s refused %s: %s: %w", c.cfg.Address, id, st.Message(), err))
	case codes.Unauthenticated:
		return upstream.Refused(fmt.Errorf("upstream trustbridge at %s did not accept the certificate of %s in %s (is it an SVID of the upstream's trust domain, issued by it?): %s: %w",
			c.cfg.Address, id, c.cfg.ProvCertDir, st.Message(), err))
	case codes.Unimplemented:
		return upstream.Refused(fmt.Errorf("upstream at %s does not sign intermediates (an older trustbridge?): %w", c.cfg.Address, err))
	case codes.FailedPrecondition:
		return upstream.Refused(fmt.Errorf("upstream trustbridge at %s signs no intermediates: %s: %w", c.cfg.Address, st.Message(), err))
	case codes.InvalidArgument:
		return upstream.Refused(fmt.Errorf("upstream trustbridge at %s refused our request: %s: %w", c.cfg.Address, st.Message(), err))
	}
	return fmt.Errorf("%s: %w", c, err)
}

// ParseResponse reads an upstream's answer, untrusted input: 1 to
// MaxChainCerts chain certificates and 1 to MaxRoots roots, each at most
// MaxCertSize bytes of DER.
func ParseResponse(resp *identityapi.SignIntermediateResponse) (*ca.UpstreamChain, error) {
	chain, err := parseCerts("cert_chain", resp.GetCertChain(), MaxChainCerts)
	if err != nil {
		return nil, err
	}
	roots, err := parseCerts("roots", resp.GetRoots(), MaxRoots)
	if err != nil {
		return nil, err
	}
	return &ca.UpstreamChain{Chain: chain, Roots: roots}, nil
}

func parseCerts(field string, ders [][]byte, limit int) ([]*x509.Certificate, error) {
	if len(ders) == 0 || len(ders) > limit {
		return nil, fmt.Errorf("%s holds %d certificates; want 1 to %d", field, len(ders), limit)
	}
	out := make([]*x509.Certificate, 0, len(ders))
	for i, der := range ders {
		if len(der) > MaxCertSize {
			return nil, fmt.Errorf("%s[%d] is %d bytes, over %d", field, i, len(der), MaxCertSize)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		out = append(out, c)
	}
	return out, nil
}
