package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/server"
)

// CAConn are how a client command reaches the certificate
// service's listener and authenticates there: `ca request` and `jwt`
// share them, so a caller proves itself the same way to both.
type CAConn struct {
	Addr      string
	RootCert  string
	TokenFile string
	ProvCert  string
	ServerID  string
	Timeout   time.Duration
}

func AddCAConnFlags(f *pflag.FlagSet, o *CAConn) {
	f.StringVar(&o.Addr, "ca-addr", "", "address of the certificate service, host:port (required)")
	f.StringVar(&o.RootCert, "root-cert", "", "PEM roots of the server's trust domain, to verify the server (required)")
	f.StringVar(&o.TokenFile, "token-file", "", "file holding a bearer token (bootstrap token or Kubernetes service account token)")
	f.StringVar(&o.ProvCert, "prov-cert", "", "directory holding cert-chain.pem and key.pem to authenticate with (Istio's PROV_CERT); only read")
	f.StringVar(&o.ServerID, "server-spiffe-id", "", "SPIFFE ID the server must present (default spiffe://<trust-domain>"+server.GRPCServingPath+")")
	f.DurationVar(&o.Timeout, "timeout", 30*time.Second, "deadline for the whole request")
}

// CheckAuth checks the flags of a command that authenticates with
// --token-file or --prov-cert, one of them.
func (o CAConn) CheckAuth() error {
	if o.Addr == "" || o.RootCert == "" {
		return errors.New("--ca-addr and --root-cert are required")
	}
	if CountTrue(o.TokenFile != "", o.ProvCert != "") != 1 {
		return errors.New("give exactly one of --token-file (bootstrap or service account token) and --prov-cert DIR (authenticate with the certificate in DIR)")
	}
	if o.Timeout <= 0 {
		return fmt.Errorf("--timeout %s must be positive", o.Timeout)
	}
	return nil
}

// Credentials reads the certificate of --prov-cert (whose identity sets
// *want when it is zero) or the token of --token-file.
func (o CAConn) Credentials(now time.Time, want *spiffeid.ID) (*tls.Certificate, string, error) {
	return ClientCredentials(o.ProvCert, "--prov-cert", o.TokenFile, now, want)
}

// ClientCredentials is the certificate in dir (flag names it in errors),
// whose identity sets *want when it is zero, or else the token in
// tokenFile.
func ClientCredentials(dir, flag, tokenFile string, now time.Time, want *spiffeid.ID) (*tls.Certificate, string, error) {
	if dir == "" {
		token, err := caclient.ReadToken(tokenFile)
		if err != nil {
			return nil, "", fmt.Errorf("--token-file: %w", err)
		}
		return nil, token, nil
	}
	cert, id, err := caclient.LoadCertDir(dir, now)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", flag, err)
	}
	if want.IsZero() {
		*want = id
	}
	return cert, "", nil
}

// Server reads --root-cert and returns the roots and the SPIFFE ID the
// server must present (expectedServerID).
func (o CAConn) Server(want spiffeid.ID) ([]*x509.Certificate, spiffeid.ID, error) {
	roots, err := ReadPEMCerts(o.RootCert)
	if err != nil {
		return nil, spiffeid.ID{}, fmt.Errorf("--root-cert: %w", err)
	}
	serverID, err := ExpectedServerID(o.ServerID, roots, want)
	if err != nil {
		return nil, spiffeid.ID{}, err
	}
	return roots, serverID, nil
}

// Dial connects as a call needs: TLS verifying the server and
// presenting the client certificate, if any, and the bearer token, if
// any. local is the server's trust domain, the caller's own.
func (o CAConn) Dial(now time.Time) (conn *grpc.ClientConn, local spiffeid.TrustDomain, err error) {
	var want spiffeid.ID
	cert, token, err := o.Credentials(now, &want)
	if err != nil {
		return nil, local, err
	}
	roots, serverID, err := o.Server(want)
	if err != nil {
		return nil, local, err
	}
	conn, err = caclient.Dial(o.Addr, caclient.ServerTLS(roots, serverID, cert), token)
	return conn, serverID.TrustDomain(), err
}

// ExpectedServerID is --server-spiffe-id, or else the certificate
// service's ID in the trust domain of the identity requested (--spiffe-id,
// or the certificate of --renew or --prov-cert), or else in the one trust domain the
// roots name (caclient.ExpectedServerID).
func ExpectedServerID(flag string, roots []*x509.Certificate, want spiffeid.ID) (spiffeid.ID, error) {
	if flag != "" {
		id, err := spiffeid.FromString(flag)
		if err != nil {
			return id, fmt.Errorf("--server-spiffe-id %q: %w", flag, err)
		}
		return id, nil
	}
	return caclient.ExpectedServerID(roots, want)
}

// BearerToken sends "authorization: Bearer <token>", only over TLS.
type BearerToken = caclient.BearerToken

// RequestError says what a failed call means for the person running it.
func RequestError(addr string, timeout time.Duration, what string, err error) error {
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
		return fmt.Errorf("cannot get %s from %s (is the server running with --grpc-listen, and does --root-cert hold its roots?): %s", what, addr, msg)
	case codes.DeadlineExceeded:
		return fmt.Errorf("no answer from the CA at %s within --timeout %s: %s", addr, timeout, msg)
	}
	return fmt.Errorf("the CA at %s: %s: %s", addr, st.Code(), msg)
}
