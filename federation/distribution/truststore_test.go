package distribution

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	pkcs12 "software.sslmate.com/src/go-pkcs12"
)

// TestTruststoreProfiles: every profile encodes a truststore that decodes
// to the local roots under its password, and nothing else opens it; an
// unknown profile is refused by New.
func TestTruststoreProfiles(t *testing.T) {
	store, cas := newStore(t, "peer.example")
	local := cas[localTD].Bundle()
	for _, ts := range []Truststore{
		{Enabled: true},
		{Enabled: true, Password: "changeit"},
		{Enabled: true, Password: "s3cret", Profile: ProfileLegacyDES},
		{Enabled: true, Password: "s3cret", Profile: ProfileLegacyRC2},
		{Enabled: true, Password: "s3cret", Profile: ProfileModern2023},
	} {
		t.Run(ts.Profile+"/"+ts.Password, func(t *testing.T) {
			enc, err := ts.encoder()
			require.NoError(t, err)
			p12, roots, err := encodeTruststore(enc, local, ts.Password)
			require.NoError(t, err)
			assert.Equal(t, local.X509Authorities(), roots)
			assert.True(t, truststoreHolds(p12, ts.Password, roots))
			assert.False(t, truststoreHolds(p12, ts.Password+"x", roots) && ts.Password != "", "opens under a wrong password")
			peer := cas["peer.example"].Bundle().X509Authorities()
			assert.False(t, truststoreHolds(p12, ts.Password, peer), "holds a federated root")
			certs, err := pkcs12.DecodeTrustStore(p12, ts.Password)
			require.NoError(t, err)
			assert.Len(t, certs, len(local.X509Authorities()))
		})
	}
	_, err := New(Config{Client: fake.NewClientset(), Store: store, TrustDomain: spiffeid.RequireTrustDomainFromString(localTD),
		Truststore: Truststore{Enabled: true, Password: "x", Profile: "Modern2099"}})
	assert.ErrorContains(t, err, `truststore profile "Modern2099"`)
}

func TestCheckMetadata(t *testing.T) {
	tests := []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		wantErr     string
	}{
		{name: "none"},
		{name: "valid", labels: map[string]string{"team.example/owner": "platform"}, annotations: map[string]string{"example.com/note": "any text, even spaces"}},
		{name: "managed-by refused", labels: map[string]string{ManagedByLabel: "helm"}, wantErr: "controller's own"},
		{name: "bad label key", labels: map[string]string{"bad key": "v"}, wantErr: `label key "bad key"`},
		{name: "bad label value", labels: map[string]string{"k": "not a value"}, wantErr: `label "k" value`},
		{name: "bad annotation key", annotations: map[string]string{"/x": "v"}, wantErr: `annotation key "/x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkMetadata(tt.labels, tt.annotations)
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestNewRefusesUnknownKind(t *testing.T) {
	store, _ := newStore(t)
	_, err := New(Config{Client: fake.NewClientset(), Store: store, TrustDomain: spiffeid.RequireTrustDomainFromString(localTD), Kind: "Pod"})
	assert.ErrorContains(t, err, `kind "Pod"`)
}

// TestContentHoldsRoots: another encoding of the same roots counts as
// current, one of other roots or under another password does not, and
// the answers are remembered by digest.
func TestContentHoldsRoots(t *testing.T) {
	_, cas := newStore(t, "peer.example")
	local, peer := cas[localTD].Bundle(), cas["peer.example"].Bundle()
	enc := pkcs12.Modern2023
	p12, roots, err := encodeTruststore(enc, local, "pw")
	require.NoError(t, err)
	cur := &content{truststore: p12, roots: roots}
	again, _, err := encodeTruststore(enc, local, "pw")
	require.NoError(t, err)
	require.NotEqual(t, p12, again, "fresh salts")
	other, _, err := encodeTruststore(enc, peer, "pw")
	require.NoError(t, err)
	sealedElse, _, err := encodeTruststore(enc, local, "other")
	require.NoError(t, err)

	assert.True(t, cur.holdsRoots(p12, "pw"))
	for range 2 { // the second round answers from the cache
		assert.True(t, cur.holdsRoots(again, "pw"))
		assert.False(t, cur.holdsRoots(other, "pw"))
		assert.False(t, cur.holdsRoots(sealedElse, "pw"))
		assert.False(t, cur.holdsRoots([]byte("garbage"), "pw"))
	}
	n := 0
	cur.opened.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, 4, n)
}
