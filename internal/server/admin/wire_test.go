package admin

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"flag"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/authn/oidc"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

var updateWire = flag.Bool("update", false, "rewrite testdata/wire/*.json from what the handlers answer now")

// seededKey is an Ed25519 key from a one-byte seed: Ed25519 signatures
// are deterministic, so certificates signed with it are the same bytes
// on every run.
func seededKey(seed byte) ed25519.PrivateKey {
	s := make([]byte, ed25519.SeedSize)
	s[0] = seed
	return ed25519.NewKeyFromSeed(s)
}

// fixedRoot is a root certificate of td that is the same bytes on every
// run (key, serial, subject and validity fixed).
func fixedRoot(t *testing.T, td string, seed byte) *x509.Certificate {
	t.Helper()
	return testca.New(t, td, testca.Options{
		Key: seededKey(seed), NotBefore: t0.Add(-30 * 24 * time.Hour), NotAfter: t0.Add(time.Duration(seed) * 24 * time.Hour),
		Mutate: func(c *x509.Certificate) {
			c.SerialNumber = big.NewInt(int64(seed))
			c.Subject = pkix.Name{Organization: []string{td}, CommonName: "root " + string('0'+rune(seed))}
		},
	}).Cert
}

type wireFederation []federation.Status

// wireAuthorities lists the wire state's roots and JWT keys, and changes
// nothing.
type wireAuthorities struct {
	*fakeCA
	fakeJWTKeys
}

func (wireAuthorities) ChangeAuthority(ca.AuthorityChange) (string, error) {
	return "", errors.New("the wire state does not change")
}

func (f wireFederation) Status() []federation.Status                       { return f }
func (wireFederation) Refresh(context.Context, spiffeid.TrustDomain) error { return nil }

// wireConfig is a server state that fills every field of every /v1
// document at least once: roots in each rotation state, one from a key
// manager and one from an upstream, JWT keys with their records, a
// federated trust domain polled with trouble, one never polled, a static
// one, a trust policy, issuers and an upstream's health.
func wireConfig(t *testing.T) Config {
	t.Helper()
	f := newFixture(t)
	active, prepared, retired := fixedRoot(t, localTD.Name(), 1), fixedRoot(t, localTD.Name(), 2), fixedRoot(t, localTD.Name(), 3)
	local := spiffebundle.FromX509Authorities(localTD, []*x509.Certificate{active, prepared, retired})
	local.SetSequenceNumber(7)
	local.SetRefreshHint(5 * time.Minute)
	jwtActive, jwtNext := seededKey(4).Public(), seededKey(5).Public()
	require.NoError(t, local.AddJWTAuthority("k-active", jwtActive))
	require.NoError(t, local.AddJWTAuthority("k-next", jwtNext))
	f.ca.bundle = local
	f.ca.roots = []ca.RootInfo{
		{RootRecord: castate.RootRecord{ID: "01", State: castate.StateActive, CertSHA256: "aa", KeyRef: "pkcs11:object=root-01",
			PreparedAt: t0.Add(-48 * time.Hour), ActivatedAt: t0.Add(-24 * time.Hour),
			Upstream: &castate.UpstreamRecord{Name: "corp-vault"}}, Cert: active},
		{RootRecord: castate.RootRecord{ID: "02", State: castate.StatePrepared, CertSHA256: "bb", PreparedAt: t0.Add(-time.Hour),
			PublishedAt: t0.Add(-time.Hour)}, Cert: prepared},
		{RootRecord: castate.RootRecord{ID: "03", State: castate.StateRetired, CertSHA256: "cc", PreparedAt: t0.Add(-72 * time.Hour),
			ActivatedAt: t0.Add(-60 * time.Hour), RetiredAt: t0.Add(-24 * time.Hour), RemoveAfter: t0.Add(24 * time.Hour),
			TaintedAt: t0.Add(-20 * time.Minute)}, Cert: retired},
		{RootRecord: castate.RootRecord{ID: "04", State: castate.StateRevoked, CertSHA256: "ee", PreparedAt: t0.Add(-96 * time.Hour),
			ActivatedAt: t0.Add(-84 * time.Hour), RetiredAt: t0.Add(-60 * time.Hour), RemoveAfter: t0.Add(-12 * time.Hour),
			TaintedAt: t0.Add(-30 * time.Minute)}, Cert: fixedRoot(t, localTD.Name(), 9), RevokedAt: t0.Add(-10 * time.Minute)},
	}
	jwtOld := seededKey(10).Public()
	f.cfg.JWT = fakeJWTKeys{
		{JWTKeyRecord: castate.JWTKeyRecord{KID: "k-active", State: castate.StateActive, Algorithm: "EdDSA",
			CreatedAt: t0.Add(-20 * 24 * time.Hour), NotAfter: t0.Add(10 * 24 * time.Hour),
			PreparedAt: t0.Add(-20 * 24 * time.Hour), ActivatedAt: t0.Add(-19 * 24 * time.Hour), KeyRef: "pkcs11:object=jwt-1"}, Public: jwtActive},
		{JWTKeyRecord: castate.JWTKeyRecord{KID: "k-next", State: castate.StatePrepared,
			CreatedAt: t0.Add(-time.Hour), NotAfter: t0.Add(29 * 24 * time.Hour), PreparedAt: t0.Add(-time.Hour), PublishedAt: t0.Add(-time.Hour)}, Public: jwtNext},
		{JWTKeyRecord: castate.JWTKeyRecord{KID: "k-old", State: castate.StateRevoked, Algorithm: "EdDSA",
			CreatedAt: t0.Add(-40 * 24 * time.Hour), NotAfter: t0.Add(2 * time.Hour), PreparedAt: t0.Add(-40 * 24 * time.Hour),
			ActivatedAt: t0.Add(-39 * 24 * time.Hour), RetiredAt: t0.Add(-19 * 24 * time.Hour), TaintedAt: t0.Add(-30 * time.Minute)},
			Public: jwtOld, RevokedAt: t0.Add(-10 * time.Minute)},
	}
	f.cfg.Authorities = wireAuthorities{f.ca, f.cfg.JWT.(fakeJWTKeys)}
	f.cfg.LogLevel = new(slog.LevelVar)
	f.cfg.Signed = func() (map[string]api.SignedCount, time.Time) {
		return map[string]api.SignedCount{
			"x509:" + hex.EncodeToString(active.SubjectKeyId):  {Live: 40, InUse: 38, Last: t0.Add(time.Hour)},
			"x509:" + hex.EncodeToString(retired.SubjectKeyId): {Live: 3, InUse: 1, Last: t0.Add(30 * time.Minute)},
			"jwt:k-active": {Live: 12, InUse: 9, Last: t0.Add(5 * time.Minute)},
		}, t0.Add(-6 * time.Hour)
	}
	f.cfg.Fetchers = func() []api.BundleFetcher {
		return []api.BundleFetcher{
			{Client: "198.51.100.7", UserAgent: "trustbridge/1.4 (federation)", LastFetch: t0.Add(-2 * time.Minute), Sequence: 41},
			{Client: "192.0.2.10", LastFetch: t0.Add(-3 * time.Hour), Sequence: 39},
		}
	}

	peerRoot := fixedRoot(t, peerTD.Name(), 6)
	peer := spiffebundle.FromX509Authorities(peerTD, []*x509.Certificate{peerRoot})
	peer.SetSequenceNumber(3)
	peerJWT := seededKey(7).Public()
	require.NoError(t, peer.AddJWTAuthority("peer-1", peerJWT))
	store := f.cfg.Trust.(interface {
		Set(string, *spiffebundle.Bundle)
	})
	store.Set("ca", local)
	store.Set("federation:"+peerTD.Name(), peer)
	static := spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("static.example"), []*x509.Certificate{fixedRoot(t, "static.example", 8)})
	store.Set("file:/etc/static.json", static)

	seq, hint := uint64(3), int64(300)
	attempt, success, next := t0.Add(-time.Minute), t0.Add(-10*time.Minute), t0.Add(4*time.Minute)
	notAfter := peerRoot.NotAfter.UTC()
	f.cfg.Federation = wireFederation{
		{TrustDomain: peerTD.Name(), EndpointURL: "https://peer.example/bundle", Profile: federation.ProfileHTTPSSPIFFE,
			EndpointSPIFFEID: "spiffe://peer.example/bundle-server", State: federation.StateFailing, Sequence: &seq,
			RefreshHintSeconds: &hint, LastAttempt: &attempt, LastSuccess: &success, NextRefresh: &next,
			LastError: "GET https://peer.example/bundle: tls: bad certificate", ConsecutiveFailures: 2,
			Refusals: map[string]uint64{"tls": 2, "sequence_regression": 1}, Held: federation.HeldFetched,
			Authorities: []federation.AuthorityInfo{
				{Kind: federation.AuthorityX509, SHA256: testSHA256(peerRoot.Raw), Subject: peerRoot.Subject.String(), NotAfter: &notAfter},
				{Kind: federation.AuthorityJWT, SHA256: "dd", KeyID: "peer-1"},
			}},
		{TrustDomain: "pending.example", EndpointURL: "https://pending.example/bundle", Profile: federation.ProfileHTTPSWeb,
			State: federation.StatePending, Authorities: []federation.AuthorityInfo{}},
	}
	f.cfg.Origin = func(td spiffeid.TrustDomain) string {
		return map[string]string{peerTD.Name(): "file", "pending.example": "crd:pending"}[td.Name()]
	}
	f.cfg.Static = func() []spiffeid.TrustDomain { return []spiffeid.TrustDomain{static.TrustDomain()} }
	f.cfg.KeyManager = `pkcs11 token "tb" (libsofthsm2.so)`
	f.cfg.RequireHSM = true
	f.cfg.WorkloadTTL, f.cfg.MaxWorkloadTTL = time.Hour, 24*time.Hour
	f.cfg.Upstream = func() (ca.UpstreamStatus, bool) {
		return ca.UpstreamStatus{Name: "corp-vault", LastSuccess: t0.Add(-2 * time.Hour), LastError: "vault: 503",
			LastErrorAt: t0.Add(-time.Minute), Failures: 3, FailingSince: t0.Add(-30 * time.Minute), NextAttempt: t0.Add(4 * time.Minute)}, true
	}
	f.cfg.Issuers = func() []oidc.IssuerStatus {
		return []oidc.IssuerStatus{
			{Name: "ci", Kind: oidc.KindOIDC, Issuer: "https://ci.example", Keys: 2, LastFetch: t0.Add(-time.Minute), LastSuccess: t0.Add(-time.Minute)},
			{Name: "west", Kind: oidc.KindKubernetes, Issuer: "https://west.example", LastFetch: t0.Add(-time.Minute), LastError: "HTTP status 503"},
		}
	}
	f.cfg.JWTIssuers = testJWTIssuers
	withPolicy(t, f, trustpolicy.DefaultDeny, testRules())
	f.cfg.IdentityMap = testIdentityMap(t)
	return f.cfg
}

// testJWTIssuers are a relayed OIDC issuer that serves no key, on an ACME
// certificate without its host, and ours, served with both keys; given
// relayed first, shown ours first.
func testJWTIssuers() []api.OIDCIssuerStatus {
	prod := spiffeid.RequireTrustDomainFromString("prod.example")
	return []api.OIDCIssuerStatus{
		{IssuerState: bundleserver.IssuerState{URL: "https://oidc.example.com/prod", DiscoveryURL: "https://oidc.example.com/prod/.well-known/openid-configuration",
			JWKSURL: "https://oidc.example.com/prod/keys", TrustDomain: prod,
			Err: errors.New("no JWT authority to publish; the discovery document and JWKS answer 503 until one is")},
			ServedHere: true, ACME: true, CertNames: []string{"bundle.example.org"},
			CertErr: errors.New("host oidc.example.com is not among the --acme-domain names")},
		{IssuerState: bundleserver.IssuerState{URL: "https://bundle.example.org", DiscoveryURL: "https://bundle.example.org/.well-known/openid-configuration",
			JWKSURL: "https://bundle.example.org/keys", TrustDomain: localTD, Algorithms: []string{"EdDSA"},
			Keys: []bundleserver.IssuerKey{{KeyID: "k-active", Algorithm: "EdDSA", Use: "sig"}, {KeyID: "k-next", Algorithm: "EdDSA", Use: "sig"}}},
			Local: true, ServedHere: true, ACME: true, CertNames: []string{"bundle.example.org"}},
	}
}

// testIdentityMap is an identity map with a source that failed, two
// rules in conflict (one with a TTL and DNS names) and one only node
// agents can evaluate.
func testIdentityMap(t *testing.T) *IdentityMapConfig {
	t.Helper()
	uid := uint32(1000)
	m, err := identitymap.Compile(identitymap.Config{TrustDomain: localTD}, []identitymap.Rule{
		{Name: "pay-apps", Origin: "crd:pay-apps", Workloads: []identitymap.Selector{{Namespace: "pay"}},
			SPIFFEID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}", TTL: time.Hour,
			DNSNames: []string{"{{.PodLabels.app}}.{{.Namespace}}.svc"}},
		{Name: "pay-api", Origin: "file:/etc/ids.yaml:4", Workloads: []identitymap.Selector{{Namespace: "pay", ServiceAccount: "api"}},
			SPIFFEID: "spiffe://{{.TrustDomain}}/pay/{{.ServiceAccount}}"},
		{Name: "by-uid", Origin: "crd:by-uid", Workloads: []identitymap.Selector{{Kubernetes: true, UID: &uid}},
			SPIFFEID: "spiffe://{{.TrustDomain}}/uid/{{.UID}}"},
	})
	require.NoError(t, err)
	return &IdentityMapConfig{Map: func() *identitymap.Map { return m }, Statuses: func() []identitymap.Status {
		return []identitymap.Status{
			{Source: "crd", Rules: 2, LastSuccess: t0.Add(-time.Minute).Unix()},
			{Source: "file:/etc/ids.yaml", Rules: 1, LastError: "identitymap: file:/etc/ids.yaml:9: rule 2: no spiffeID template", LastSuccess: t0.Add(-time.Hour).Unix()},
		}
	}}
}

func testSHA256(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// The /v1 documents are the admin API's wire: the CLI, scripts and
// dashboards decode them. For one server state that fills every field,
// each document must be the bytes in testdata/wire, so that a change to
// the wire is a reviewed change to a golden file (go test -update
// rewrites them).
func TestWireDocuments(t *testing.T) {
	h := New(wireConfig(t))
	for name, target := range map[string]string{
		"federation":    "/v1/federation",
		"relationships": "/v1/federation/relationships",
		"snapshot":      "/v1/snapshot",
		"trust":         "/v1/trust",
		"authorities":   "/v1/ca/authorities",
		"fetchers":      "/v1/bundle/fetchers",
		"issuers":       "/v1/authn/issuers",
		"loglevel":      "/v1/log/level",
		"explain":       "/v1/policy/explain?spiffe_id=spiffe://example.org/ns/ops/sa/a",
		"identity":      "/v1/identity/explain?namespace=pay&service_account=web&pod_name=web-1&pod_uid=u1&node_name=node-a&label=app=checkout",
	} {
		t.Run(name, func(t *testing.T) {
			rec := do(t, h, http.MethodGet, target)
			got := body(t, rec)
			require.Equal(t, http.StatusOK, rec.Code, got)
			path := filepath.Join("testdata", "wire", name+".json")
			if *updateWire {
				require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
				require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "go test ./internal/server/admin -run TestWireDocuments -update writes it")
			assert.Equal(t, string(want), got, "%s changed on the wire; if that is meant, rewrite testdata/wire with -update and say so in CHANGELOG.md", target)
		})
	}
}
