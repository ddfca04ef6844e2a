package caclient

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func hexSum(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// A message's taints are read strictly, entry by entry: one the client
// cannot read is left out and named in TaintedErr, while the bundles and
// the other taints are still taken.
func TestParseWatchBundlesTaints(t *testing.T) {
	a := testca.New(t, tdA.Name())
	good := &identityapi.TaintedAuthority{X509SubjectKeyId: hex.EncodeToString(a.Cert.SubjectKeyId), X509Sha256: hexSum(a.Cert.Raw), TaintedAtUnix: 1700000000}
	jwt := &identityapi.TaintedAuthority{JwtKeyId: "kid-1"}
	for _, tc := range []struct {
		name    string
		taints  []*identityapi.TaintedAuthority
		spread  int64
		want    int
		wantErr string
	}{
		{"x509 and jwt", []*identityapi.TaintedAuthority{good, jwt}, 60, 2, ""},
		{"uppercase hex", []*identityapi.TaintedAuthority{{X509SubjectKeyId: "AB", X509Sha256: hexSum(nil)}, jwt}, 0, 1, "not lowercase hex"},
		{"bad hex", []*identityapi.TaintedAuthority{{X509SubjectKeyId: "zz", X509Sha256: hexSum(nil)}, good}, 0, 1, "x509_subject_key_id"},
		{"short sum", []*identityapi.TaintedAuthority{{X509SubjectKeyId: "ab", X509Sha256: "abcd"}}, 0, 0, "2 bytes, not 32"},
		{"half a pair", []*identityapi.TaintedAuthority{{X509Sha256: hexSum(nil)}}, 0, 0, "needs both"},
		{"both kinds", []*identityapi.TaintedAuthority{{JwtKeyId: "k", X509Sha256: hexSum(nil)}}, 0, 0, "one or the other"},
		{"negative spread", []*identityapi.TaintedAuthority{jwt}, -1, 1, "negative"},
		{"huge spread", []*identityapi.TaintedAuthority{jwt}, 1 << 40, 1, "is over"},
		{"too many", make64Plus(jwt), 0, MaxTaintedAuthorities, "the first 64 are taken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := &identityapi.WatchBundlesResponse{BundleMap: marshalMap(t, a.Bundle()), TaintedAuthorities: tc.taints, ReissueSpreadSeconds: tc.spread}
			got, err := ParseWatchBundles(msg, tdA)
			require.NoError(t, err, "the bundles are taken whatever the taints")
			assert.Len(t, got.Bundles, 1)
			assert.Len(t, got.Tainted, tc.want)
			if tc.wantErr == "" {
				assert.NoError(t, got.TaintedErr)
				return
			}
			assert.ErrorContains(t, got.TaintedErr, tc.wantErr)
		})
	}
	got, err := ParseWatchBundles(&identityapi.WatchBundlesResponse{BundleMap: marshalMap(t, a.Bundle()),
		TaintedAuthorities: []*identityapi.TaintedAuthority{good}, ReissueSpreadSeconds: 1 << 40}, tdA)
	require.NoError(t, err)
	assert.Equal(t, MaxReissueSpread, got.ReissueSpread)
	assert.Equal(t, a.Cert.SubjectKeyId, got.Tainted[0].X509SubjectKeyID)
	assert.Equal(t, time.Unix(1700000000, 0).UTC(), got.Tainted[0].At)
}

func make64Plus(t *identityapi.TaintedAuthority) []*identityapi.TaintedAuthority {
	out := make([]*identityapi.TaintedAuthority, MaxTaintedAuthorities+1)
	for i := range out {
		out[i] = t
	}
	return out
}

func TestSignedBy(t *testing.T) {
	root, other := testca.New(t, tdA.Name()), testca.New(t, tdA.Name())
	id := spiffeid.RequireFromPath(tdA, "/w")
	leaf, _ := root.Issue(t, id)
	otherLeaf, _ := other.Issue(t, id)
	bySKID := TaintedAuthority{X509SubjectKeyID: root.Cert.SubjectKeyId}
	sum := sha256.Sum256(root.Cert.Raw)
	bySum := TaintedAuthority{X509SHA256: sum[:]}
	for _, tc := range []struct {
		name   string
		chain  []*x509.Certificate
		taints []TaintedAuthority
		want   bool
	}{
		{"leaf's issuer by key id", []*x509.Certificate{leaf}, []TaintedAuthority{bySKID}, true},
		{"chain holds the tainted certificate", []*x509.Certificate{otherLeaf, root.Cert}, []TaintedAuthority{bySum}, true},
		{"another issuer", []*x509.Certificate{otherLeaf}, []TaintedAuthority{bySKID, bySum}, false},
		{"a JWT key only", []*x509.Certificate{leaf}, []TaintedAuthority{{JWTKeyID: "k"}}, false},
		{"no chain", nil, []TaintedAuthority{bySKID}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, SignedBy(tc.chain, tc.taints))
		})
	}
	assert.True(t, TaintedKeyID("k", []TaintedAuthority{bySKID, {JWTKeyID: "k"}}))
	assert.False(t, TaintedKeyID("", []TaintedAuthority{bySKID}), "an X.509 entry taints no kid")
}

// FuzzParseTaints: whatever tainted authorities the server sends, the
// bundles are taken, and every taint taken is a JWT key or an X.509
// authority with a key ID and a 32-byte hash, the spread in
// [0, MaxReissueSpread].
func FuzzParseTaints(f *testing.F) {
	doc := marshalMap(f, testca.New(f, tdA.Name()).Bundle())
	f.Add("ab", hexSum(nil), "", int64(1700000000), int64(60))
	f.Add("", "", "kid", int64(0), int64(0))
	f.Add("AB", "zz", "kid", int64(-1), int64(-5))
	f.Add("ab", "abcd", "", int64(1<<62), int64(1<<62))
	f.Fuzz(func(t *testing.T, skid, sum, kid string, at, spread int64) {
		msg := &identityapi.WatchBundlesResponse{BundleMap: doc, ReissueSpreadSeconds: spread,
			TaintedAuthorities: []*identityapi.TaintedAuthority{{X509SubjectKeyId: skid, X509Sha256: sum, JwtKeyId: kid, TaintedAtUnix: at}}}
		got, err := ParseWatchBundles(msg, tdA)
		require.NoError(t, err)
		require.Len(t, got.Bundles, 1)
		require.GreaterOrEqual(t, got.ReissueSpread, time.Duration(0))
		require.LessOrEqual(t, got.ReissueSpread, MaxReissueSpread)
		require.LessOrEqual(t, len(got.Tainted), 1)
		for _, ta := range got.Tainted {
			if ta.JWTKeyID != "" {
				require.Empty(t, ta.X509SubjectKeyID)
				continue
			}
			require.NotEmpty(t, ta.X509SubjectKeyID)
			require.Len(t, ta.X509SHA256, sha256.Size)
		}
	})
}
