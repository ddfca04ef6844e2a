package server

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
)

// What the admin API refuses to mint: all of /trustbridge, a custom
// bundle endpoint ID, and the names the server's listeners serve under
// (admin hosts without their port; IP literals are no DNS names).
func TestOwnIdentities(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	custom := spiffeid.RequireFromString("spiffe://example.org/infra/bundle")
	p := &serverParts{td: td, ep: &bundleEndpoint{id: custom, dnsNames: []string{"bundle.example.org"}}}
	o := Config{AdminHosts: []string{"admin.example.org:15014", "ops.example.org", "10.0.0.1:15014", "[::1]:1"}}
	o.GRPC.Listen, o.GRPC.DNSNames = "127.0.0.1:0", []string{"trustbridge.example.org", ""}
	ids, path, dns := p.ownIdentities(o)
	assert.Equal(t, []spiffeid.ID{spiffeid.RequireFromString("spiffe://example.org/trustbridge/ca"), custom}, ids)
	assert.Equal(t, "/trustbridge", path)
	assert.Equal(t, []string{"trustbridge.example.org", "bundle.example.org", "admin.example.org", "ops.example.org"}, dns)

	// No certificate service, no bundle endpoint: the path still.
	ids, path, dns = (&serverParts{td: td}).ownIdentities(Config{})
	assert.Equal(t, []spiffeid.ID{spiffeid.RequireFromString("spiffe://example.org/trustbridge/ca")}, ids)
	assert.Equal(t, "/trustbridge", path)
	assert.Empty(t, dns)
}
