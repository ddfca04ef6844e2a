package bundledoc_test

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var (
	update = flag.Bool("update", false, "rewrite the canonical golden files under testdata/bundles/canonical")
	regen  = flag.Bool("regen-fixtures", false, "mint new fixture bundles under testdata/bundles (new keys; implies -update)")
)

// fixtureDir holds cross-package fixtures: the CLI inspects the same files.
var fixtureDir = filepath.Join("..", "..", "testdata", "bundles")

// fixture describes a real-world bundle shape and what parsing it yields.
type fixture struct {
	file     string
	isMap    bool
	td       string
	x509     int
	jwt      int
	warnings []string
	build    func(t *testing.T) any
}

// longLived makes fixture roots valid for a century: the fixtures are
// checked in, and a fixture that expires would fail the CLI's goldens.
func longLived(subject pkix.Name, kt testca.KeyType, san bool) testca.Options {
	return testca.Options{
		KeyType:   kt,
		NotBefore: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:  time.Date(2126, 1, 1, 0, 0, 0, 0, time.UTC),
		Mutate: func(c *x509.Certificate) {
			c.Subject = subject
			if !san {
				c.URIs = nil
			}
		},
	}
}

func randomKid(t *testing.T) string {
	b := make([]byte, 24)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return base64.RawURLEncoding.EncodeToString(b)[:32]
}

var fixtures = []fixture{
	{
		// SPIRE server: EC roots with the trust domain's SPIFFE ID, JWT keys
		// with random 32-character kids, sequence and a 5-minute hint.
		file: "spire.json", td: "example.org", x509: 2, jwt: 2,
		build: func(t *testing.T) any {
			var keys []obj
			for range 2 {
				ca := testca.New(t, "example.org", longLived(pkix.Name{Country: []string{"US"}, Organization: []string{"SPIFFE"}}, testca.ECP256, true))
				keys = append(keys, x509Element(t, ca.Cert))
			}
			for range 2 {
				keys = append(keys, jwk(t, testca.NewKey(t, testca.ECP256).Public(), "jwt-svid", randomKid(t)))
			}
			return with(docOf(keys...), "spiffe_sequence", 7, "spiffe_refresh_hint", 300)
		},
	},
	{
		// Istio plug-in CA mid-rotation: two RSA roots named after the mesh
		// with no SPIFFE SAN, no sequence and no hint.
		file: "istio.json", td: "cluster.local", x509: 2,
		build: func(t *testing.T) any {
			var keys []obj
			for _, kt := range []testca.KeyType{testca.RSA2048, testca.RSA4096} {
				ca := testca.New(t, "cluster.local", longLived(pkix.Name{Organization: []string{"Istio"}, CommonName: "Root CA " + string(kt)}, kt, false))
				keys = append(keys, x509Element(t, ca.Cert))
			}
			return docOf(keys...)
		},
	},
	{
		// A publisher that already rolled out a post-quantum (ML-DSA, kty
		// AKP) JWT key next to a classic one: the AKP key is ignored.
		file: "pq-akp.json", td: "pq.example", x509: 1, jwt: 1,
		warnings: []string{`keys[2]: kty "AKP" is not supported; element ignored`},
		build: func(t *testing.T) any {
			ca := testca.New(t, "pq.example", longLived(pkix.Name{Organization: []string{"pq.example"}}, testca.ECP384, true))
			pub := make([]byte, 1312) // ML-DSA-44 public key size
			_, err := rand.Read(pub)
			require.NoError(t, err)
			return with(docOf(
				x509Element(t, ca.Cert),
				jwk(t, testca.NewKey(t, testca.ECP256).Public(), "jwt-svid", "classic-1"),
				obj{"kty": "AKP", "alg": "ML-DSA-44", "use": "jwt-svid", "kid": "pq-1", "pub": base64.RawURLEncoding.EncodeToString(pub)},
			), "spiffe_sequence", 3, "spiffe_refresh_hint", 600)
		},
	},
	{
		// What the spec says consumers must tolerate, all at once.
		file: "tolerant.json", td: "example.org", x509: 1, jwt: 1,
		warnings: []string{
			`keys[0]: kid must not be set on an x509-svid element; ignored`,
			`keys[1]: use "foo-svid" is not supported; element ignored`,
			`keys[2]: missing "use"; element ignored`,
			`keys[3]: x509-svid element has no x5c certificate; element ignored`,
			`keys[4]: EC curve "secp256k1" is not supported; element ignored`,
		},
		build: func(t *testing.T) any {
			ca := testca.New(t, "example.org", longLived(pkix.Name{Organization: []string{"example.org"}}, testca.ECP256, true))
			root := x509Element(t, ca.Cert)
			jwtEl := jwk(t, testca.NewKey(t, testca.ECP256).Public(), "jwt-svid", "k1")
			return with(docOf(
				with(root, "kid", "should-not-be-here"),
				with(jwtEl, "use", "foo-svid"),
				with(jwtEl, "use", nil),
				with(root, "x5c", []string{}),
				with(jwtEl, "crv", "secp256k1"),
				jwtEl,
			), "spiffe_sequence", 1, "x_vendor_extension", "ignored")
		},
	},
	{
		// All keys revoked (keys: []), which is valid and means trust nothing.
		file: "revoked.json", td: "example.org",
		build: func(t *testing.T) any {
			return with(docOf(), "spiffe_sequence", 12, "spiffe_refresh_hint", 60)
		},
	},
	{
		// A SPIFFE bundle map, as Envoy's SPIFFE validator and relays use.
		file: "bundle-map.json", isMap: true, x509: 2, jwt: 1,
		build: func(t *testing.T) any {
			east := testca.New(t, "east.example", longLived(pkix.Name{Organization: []string{"east.example"}}, testca.ECP256, true))
			west := testca.New(t, "west.example", longLived(pkix.Name{Organization: []string{"west.example"}}, testca.ECP256, true))
			return obj{"trust_domains": obj{
				"east.example": with(docOf(x509Element(t, east.Cert), jwk(t, testca.NewKey(t, testca.ECP256).Public(), "jwt-svid", "east-1")), "spiffe_sequence", 4),
				"west.example": with(docOf(x509Element(t, west.Cert)), "spiffe_sequence", 9, "spiffe_refresh_hint", 300),
			}}
		},
	},
}

func TestFixtures(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.file, func(t *testing.T) {
			path := filepath.Join(fixtureDir, fx.file)
			if *regen {
				require.NoError(t, os.WriteFile(path, append(mustJSONIndent(t, fx.build(t)), '\n'), 0o644))
			}
			data, err := os.ReadFile(path)
			require.NoError(t, err)

			var (
				bundles  []*spiffebundle.Bundle
				warnings []bundledoc.Warning
				canon    []byte
			)
			if fx.isMap {
				bundles, warnings, err = bundledoc.ParseMap(data)
				require.NoError(t, err)
				canon, err = bundledoc.MarshalMap(bundles)
			} else {
				var b *spiffebundle.Bundle
				b, warnings, err = bundledoc.Parse(spiffeid.RequireTrustDomainFromString(fx.td), data)
				require.NoError(t, err)
				bundles = []*spiffebundle.Bundle{b}
				canon, err = bundledoc.Marshal(b)
			}
			require.NoError(t, err)

			var x509s, jwts int
			for _, b := range bundles {
				x509s += len(b.X509Authorities())
				jwts += len(b.JWTAuthorities())
			}
			assert.Equal(t, fx.x509, x509s, "x509 authorities")
			assert.Equal(t, fx.jwt, jwts, "jwt authorities")
			var got []string
			for _, w := range warnings {
				got = append(got, w.String())
			}
			assert.Equal(t, fx.warnings, got)

			golden := filepath.Join(fixtureDir, "canonical", fx.file)
			if *update || *regen {
				require.NoError(t, os.MkdirAll(filepath.Dir(golden), 0o755))
				require.NoError(t, os.WriteFile(golden, canon, 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test ./internal/bundledoc -update")
			assert.Equal(t, string(want), string(canon), "canonical form changed; run with -update if intended")

			// The canonical form is a fixed point.
			if !fx.isMap {
				again, _, err := bundledoc.Parse(bundles[0].TrustDomain(), canon)
				require.NoError(t, err)
				assert.True(t, bundles[0].Equal(again))
			}
		})
	}
}

// TestFixturesParseInGoSPIFFE checks that every canonical bundle we emit is
// accepted by go-spiffe as the same bundle.
func TestFixturesParseInGoSPIFFE(t *testing.T) {
	for _, fx := range fixtures {
		if fx.isMap {
			continue
		}
		t.Run(fx.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(fixtureDir, "canonical", fx.file))
			require.NoError(t, err)
			tdn := spiffeid.RequireTrustDomainFromString(fx.td)
			ours, _, err := bundledoc.Parse(tdn, data)
			require.NoError(t, err)
			theirs, err := spiffebundle.Parse(tdn, data)
			require.NoError(t, err)
			assert.True(t, ours.Equal(theirs))
		})
	}
}

func mustJSONIndent(t testing.TB, v any) []byte {
	t.Helper()
	// Stable key order comes from encoding/json sorting map keys.
	var out bytes.Buffer
	require.NoError(t, json.Indent(&out, mustJSON(t, v), "", "  "))
	return out.Bytes()
}
