package caclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/trustbridge/trustbridge/internal/svidcheck"
)

// ServerPath is the path of the certificate service's own SPIFFE ID,
// spiffe://<trust-domain>/trustbridge/ca.
const ServerPath = "/trustbridge/ca"

// ExpectedServerID is the certificate service's ID in the trust domain of
// the identity requested (want), or else in the one trust domain the
// roots name in their spiffe://<td> URI SAN, as trustbridge's roots do.
func ExpectedServerID(roots []*x509.Certificate, want spiffeid.ID) (spiffeid.ID, error) {
	named, anonymous := svidcheck.RootTrustDomains(roots)
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
	return spiffeid.RequireFromPath(td, ServerPath), nil
}

// RootsFor keeps the roots that may vouch for td, out of a file an
// operator gave as td's roots (--root-cert). Roots naming another trust
// domain never do. When some roots name td (trustbridge's own always do),
// only those vouch: a root naming no trust domain could otherwise mint
// td's server identity. Only when none names td (a plug-in CA's roots
// often do not) do the roots naming no trust domain vouch.
func RootsFor(td spiffeid.TrustDomain, roots []*x509.Certificate) []*x509.Certificate {
	var named, anonymous []*x509.Certificate
	for _, r := range roots {
		switch other, ok := svidcheck.RootTrustDomain(r); {
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

// CheckLocalRoots checks a file meant to hold the roots of td alone
// (root-cert.pem): it must not look like a merged pool, as `ca request`
// wrote before federated trust moved to bundle.spiffe.json, because
// trusting a pool for td lets every other trust domain's CA in it mint
// td's identities. A root naming another trust domain in its URI SAN is
// refused; so are roots naming no trust domain next to roots naming td
// (trustbridge's roots always name theirs, so the anonymous ones are a
// peer's: an Istio-style or Web PKI root). A file of anonymous roots only
// (a plug-in CA's) cannot be told apart and is taken as td's: the file's
// name is its provenance. name labels the file in the error.
func CheckLocalRoots(name string, td spiffeid.TrustDomain, roots []*x509.Certificate) error {
	var named, anonymous []int
	for i, r := range roots {
		other, ok := svidcheck.RootTrustDomain(r)
		switch {
		case ok && other != td:
			return fmt.Errorf("%s: certificate %d is a root of %s, not of %s: %s", name, i, other.Name(), td.Name(), mergedAdvice(td))
		case ok:
			named = append(named, i)
		default:
			anonymous = append(anonymous, i)
		}
	}
	if len(named) > 0 && len(anonymous) > 0 {
		return fmt.Errorf("%s: certificate %d names no trust domain while certificate %d is a root of %s, as a merged pool holds "+
			"a peer's root next to ours: %s", name, anonymous[0], named[0], td.Name(), mergedAdvice(td))
	}
	return nil
}

// mergedAdvice says how to mend a root file that mixes trust domains.
func mergedAdvice(td spiffeid.TrustDomain) string {
	return fmt.Sprintf("this file must hold the roots of %s only (federated trust belongs in %s, per trust domain); "+
		"write it again with trustbridge ca request, or keep only %s's roots in it", td.Name(), BundleMapFile, td.Name())
}

func joinTDs(tds []spiffeid.TrustDomain) string {
	names := make([]string, len(tds))
	for i, td := range tds {
		names[i] = td.Name()
	}
	return strings.Join(names, ", ")
}

// ErrServerTrustDomain: the certificate service presented an identity of
// another trust domain than the one expected of it. That is how the
// server was set up or the client was told (--trust-domain,
// --server-spiffe-id): no retry mends it.
var ErrServerTrustDomain = errors.New("certificate service of another trust domain")

// VerifyServer returns a tls.Config.VerifyConnection that accepts only an
// X509-SVID for serverID chaining to RootsFor(serverID's trust domain,
// roots) (svidcheck.Verify, for serverAuth); host names play no part. A
// server presenting an identity of another trust domain is refused with
// ErrServerTrustDomain, before its chain is looked at: no roots of
// serverID's trust domain could verify it.
func VerifyServer(roots []*x509.Certificate, serverID spiffeid.ID) func(tls.ConnectionState) error {
	bundle := x509bundle.FromX509Authorities(serverID.TrustDomain(), RootsFor(serverID.TrustDomain(), roots))
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) > 0 {
			if id, err := x509svid.IDFromCert(cs.PeerCertificates[0]); err == nil && !id.MemberOf(serverID.TrustDomain()) {
				// No flag names: the agent, ca request and an upstream
				// client name these settings differently.
				return fmt.Errorf("%w: the server presents %s, an identity of %s, not of %s: "+
					"point this client at %s's certificate service, or give it %s's roots and trust domain",
					ErrServerTrustDomain, id, id.TrustDomain().Name(), serverID.TrustDomain().Name(), serverID.TrustDomain().Name(), id.TrustDomain().Name())
			}
		}
		id, _, err := svidcheck.Verify(cs.PeerCertificates, bundle, x509.ExtKeyUsageServerAuth)
		if err != nil {
			return fmt.Errorf("server certificate does not verify against --root-cert: %w", err)
		}
		if id != serverID {
			return fmt.Errorf("server is %s, want %s (see --server-spiffe-id)", id, serverID)
		}
		return nil
	}
}

// ServerTLS verifies the server as an X509-SVID for serverID against
// roots (VerifyServer), on every handshake, and presents clientCert when
// it is not nil.
func ServerTLS(roots []*x509.Certificate, serverID spiffeid.ID, clientCert *tls.Certificate) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// crypto/tls's own verification checks a host name; it is
		// replaced by VerifyConnection, which also runs on resumption.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection as an X509-SVID
		VerifyConnection:   VerifyServer(roots, serverID),
	}
	if clientCert != nil {
		cfg.Certificates = []tls.Certificate{*clientCert}
	}
	return cfg
}
