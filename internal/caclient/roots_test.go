package caclient

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var (
	exampleTD = spiffeid.RequireTrustDomainFromString("example.org")
	otherTD   = spiffeid.RequireTrustDomainFromString("other.example")
	laptopID  = spiffeid.RequireFromString("spiffe://example.org/vm/laptop")
	anonymous = testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }}
)

func TestExpectedServerID(t *testing.T) {
	ours := testca.New(t, "example.org").Cert
	theirs := testca.New(t, "other.example").Cert
	plain := &x509.Certificate{} // a root without a SPIFFE ID, as plug-in CAs have
	want := spiffeid.RequireFromString("spiffe://want.example/w")
	tests := []struct {
		name  string
		roots []*x509.Certificate
		want  spiffeid.ID
		id    string
		err   string
	}{
		{name: "from the roots", roots: []*x509.Certificate{ours}, id: "spiffe://example.org/trustbridge/ca"},
		{name: "from the roots, twice", roots: []*x509.Certificate{ours, ours}, id: "spiffe://example.org/trustbridge/ca"},
		{name: "from the requested ID", roots: []*x509.Certificate{plain}, want: want, id: "spiffe://want.example/trustbridge/ca"},
		{name: "requested ID among merged roots", roots: []*x509.Certificate{theirs, ours}, want: spiffeid.RequireFromString("spiffe://example.org/w"), id: "spiffe://example.org/trustbridge/ca"},
		{name: "requested ID not among the roots", roots: []*x509.Certificate{ours}, want: want, err: "not of want.example"},
		{name: "two trust domains", roots: []*x509.Certificate{ours, theirs}, err: "several trust domains (example.org, other.example)"},
		{name: "nothing to go by", roots: []*x509.Certificate{plain}, err: "cannot tell"},
		{name: "no roots", err: "cannot tell"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := ExpectedServerID(tt.roots, tt.want)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.id, id.String())
		})
	}
}

func TestCheckLocalRoots(t *testing.T) {
	local := testca.New(t, "example.org").Cert
	plain := testca.New(t, "example.org", anonymous).Cert
	fed := testca.New(t, "other.example").Cert
	plain2 := testca.New(t, "example.org", anonymous).Cert
	require.NoError(t, CheckLocalRoots("root-cert.pem", exampleTD, []*x509.Certificate{local}))
	require.NoError(t, CheckLocalRoots("root-cert.pem", exampleTD, []*x509.Certificate{plain, plain2}), "a plug-in CA's roots name no trust domain")
	require.NoError(t, CheckLocalRoots("root-cert.pem", exampleTD, nil))
	// Our root next to one naming no trust domain: a merged pool holding a
	// peer's Istio-style root.
	err := CheckLocalRoots("root-cert.pem", exampleTD, []*x509.Certificate{local, plain})
	assert.ErrorContains(t, err, "root-cert.pem: certificate 1 names no trust domain while certificate 0 is a root of example.org")
	err = CheckLocalRoots("root-cert.pem", exampleTD, []*x509.Certificate{local, fed})
	require.Error(t, err)
	for _, want := range []string{"root-cert.pem: certificate 1 is a root of other.example, not of example.org", "bundle.spiffe.json"} {
		assert.ErrorContains(t, err, want)
	}
}

func TestRootsFor(t *testing.T) {
	local := testca.New(t, "example.org").Cert
	plain := testca.New(t, "example.org", anonymous).Cert
	fed := testca.New(t, "other.example").Cert
	assert.Equal(t, []*x509.Certificate{local}, RootsFor(exampleTD, []*x509.Certificate{plain, fed, local}), "named roots only")
	assert.Equal(t, []*x509.Certificate{plain}, RootsFor(exampleTD, []*x509.Certificate{plain, fed}), "anonymous ones when none is named")
	assert.Empty(t, RootsFor(exampleTD, []*x509.Certificate{fed}))
}

// TestServerTLSRoots: a root-cert.pem of merged trust holds the roots of
// federated trust domains, and some of them name no trust domain (plug-in
// CAs). When the server's trust domain has roots that name it, only those
// vouch for the server: an anonymous federated root must not be able to
// mint spiffe://<td>/trustbridge/ca and receive our bearer token. When no
// root names it (a plug-in CA of our own), the anonymous ones still do.
func TestServerTLSRoots(t *testing.T) {
	local := testca.New(t, "example.org")
	localPlain := testca.New(t, "example.org", anonymous)
	foreignPlain := testca.New(t, "relay.example", anonymous)
	foreign := testca.New(t, "relay.example")
	serverID := spiffeid.RequireFromPath(exampleTD, ServerPath)
	tests := []struct {
		name   string
		roots  []*x509.Certificate
		signer *testca.CA
		id     spiffeid.ID
		err    string
		mutate func(*x509.Certificate)
	}{
		{"local root", []*x509.Certificate{local.Cert, foreignPlain.Cert}, local, serverID, "", nil},
		{"anonymous federated root next to named local roots", []*x509.Certificate{local.Cert, foreignPlain.Cert}, foreignPlain, serverID, "does not verify", nil},
		{"named federated root", []*x509.Certificate{local.Cert, foreign.Cert}, foreign, serverID, "does not verify", nil},
		{"plug-in local root names no trust domain", []*x509.Certificate{localPlain.Cert, foreign.Cert}, localPlain, serverID, "", nil},
		{"plug-in: named federated root", []*x509.Certificate{localPlain.Cert, foreign.Cert}, foreign, serverID, "does not verify", nil},
		{"another identity of the trust domain", []*x509.Certificate{local.Cert}, local, laptopID, "want " + serverID.String(), nil},
		// svidcheck's rules, as for every X509-SVID trustbridge checks.
		{"server certificate for clientAuth only", []*x509.Certificate{local.Cert}, local, serverID, "serverAuth", func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}},
		{"leaf is a CA", []*x509.Certificate{local.Cert}, local, serverID, "is a CA", func(c *x509.Certificate) { c.IsCA = true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leaf, _ := tt.signer.Issue(t, tt.id, testca.Options{Mutate: tt.mutate})
			cfg := ServerTLS(tt.roots, serverID, nil)
			assert.Empty(t, cfg.Certificates)
			err := cfg.VerifyConnection(tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}})
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			assert.NoError(t, err)
		})
	}
}
