package authn

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// idOnly drops the grant, for tests about who the caller is.
func idOnly(id Identity) Identity { return Identity{ID: id.ID, Method: id.Method} }

var grantTime = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

func bootstrapRef(token string) string { return BootstrapGrantRef(sha256.Sum256([]byte(token))) }

func TestGrantExtensionRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		grant Grant
	}{
		{name: "bootstrap", grant: Grant{Method: MethodBootstrapToken, Ref: bootstrapRef(tokLaptop), GrantedAt: grantTime}},
		{name: "kubernetes with uid", grant: Grant{Method: MethodKubernetesJWT, Ref: "default/web", UID: "8a7e3c52-0000-4000-8000-000000000001", GrantedAt: grantTime}},
		{name: "kubernetes without uid", grant: Grant{Method: MethodKubernetesJWT, Ref: "prod/web.v2", GrantedAt: grantTime}},
		{name: "legacy", grant: Grant{Method: GrantMethodLegacy, GrantedAt: grantTime}},
		{name: "oidc issuer", grant: Grant{Method: MethodOIDC, Ref: "github-actions", UID: IssuerGrantUID("https://token.actions.githubusercontent.com"), GrantedAt: grantTime}},
		{name: "remote cluster issuer", grant: Grant{Method: MethodKubernetesIssuer, Ref: "west-1", UID: IssuerGrantUID("https://oidc.west.example"), GrantedAt: grantTime}},
		{name: "minted by SDS", grant: Grant{Method: GrantMethodSDS, GrantedAt: grantTime}},
		{name: "time is kept to the second, in UTC", grant: Grant{Method: GrantMethodLegacy, GrantedAt: grantTime.Add(999 * time.Millisecond).In(time.FixedZone("x", 3600))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ext, err := tt.grant.Extension()
			require.NoError(t, err)
			assert.True(t, ext.Id.Equal(GrantOID))
			assert.False(t, ext.Critical, "verifiers that do not know the OID must not reject the leaf")
			got, err := ParseGrant(ext.Value)
			require.NoError(t, err)
			want := tt.grant
			want.GrantedAt = want.GrantedAt.UTC().Truncate(time.Second)
			assert.Equal(t, want, got)
		})
	}
}

// Extension writes exactly what encoding/asn1 writes for grantASN1, the
// encoding trustbridge wrote before and ParseGrant reads: short and long
// lengths, empty and multi-byte UTF-8 fields, any time zone.
func TestGrantMarshalMatchesEncodingASN1(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes: a two-byte length
	for _, g := range []Grant{
		{Method: MethodBootstrapToken, Ref: bootstrapRef(tokLaptop), GrantedAt: grantTime},
		{Method: MethodKubernetesJWT, Ref: "default/web", UID: "8a7e3c52-0000-4000-8000-000000000001", GrantedAt: grantTime},
		{Method: GrantMethodLegacy, GrantedAt: grantTime.In(time.FixedZone("x", -7200))},
		{Method: MethodOIDC, Ref: "github-actions", UID: IssuerGrantUID("https://token.actions.githubusercontent.com"), GrantedAt: grantTime},
		{Method: MethodKubernetesIssuer, Ref: long, UID: long[:maxGrantUID/2*2], GrantedAt: grantTime},
		{Method: GrantMethodSDS, GrantedAt: time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)},
	} {
		assertMarshalsAsEncodingASN1(t, g)
	}
}

// assertMarshalsAsEncodingASN1: a grant check refuses is refused, and
// any other encodes as encoding/asn1 encodes it, or fails where it fails
// (a year GeneralizedTime cannot hold).
func assertMarshalsAsEncodingASN1(t *testing.T, g Grant) {
	t.Helper()
	g.GrantedAt = g.GrantedAt.UTC().Truncate(time.Second)
	ext, err := g.Extension()
	if g.check() != nil {
		require.Error(t, err, "%+v", g)
		return
	}
	want, werr := asn1.Marshal(grantASN1{Version: grantVersion, Method: g.Method, Ref: g.Ref, UID: g.UID, GrantedAt: g.GrantedAt})
	if werr != nil {
		require.Error(t, err, "%+v: encoding/asn1 refuses it: %v", g, werr)
		return
	}
	require.NoError(t, err, "%+v", g)
	assert.Equal(t, want, ext.Value, "%+v", g)
}

func FuzzGrantMarshal(f *testing.F) {
	f.Add(uint8(1), "default/web", "uid", int64(1700000000))
	f.Add(uint8(3), "github-actions", IssuerGrantUID("https://a.example"), int64(0))
	f.Fuzz(func(t *testing.T, m uint8, ref, uid string, unix int64) {
		methods := []string{MethodBootstrapToken, MethodKubernetesJWT, MethodOIDC, MethodKubernetesIssuer, GrantMethodLegacy, GrantMethodSDS}
		g := Grant{Method: methods[int(m)%len(methods)], Ref: ref, UID: uid, GrantedAt: time.Unix(unix%(1<<37), 0)}
		assertMarshalsAsEncodingASN1(t, g)
	})
}

func TestGrantExtensionRefuses(t *testing.T) {
	tests := []struct {
		name   string
		grant  Grant
		errHas string
	}{
		{name: "renewal is never a grant", grant: Grant{Method: MethodX509SVID, GrantedAt: grantTime}, errHas: "unknown method"},
		{name: "unknown method", grant: Grant{Method: "password", GrantedAt: grantTime}, errHas: "unknown method"},
		{name: "no time", grant: Grant{Method: GrantMethodLegacy}, errHas: "no grant time"},
		{name: "bootstrap ref is the token", grant: Grant{Method: MethodBootstrapToken, Ref: tokLaptop, GrantedAt: grantTime}, errHas: "hex digits"},
		{name: "bootstrap ref upper case", grant: Grant{Method: MethodBootstrapToken, Ref: strings.ToUpper(bootstrapRef(tokLaptop)), GrantedAt: grantTime}, errHas: "hex digits"},
		{name: "bootstrap with uid", grant: Grant{Method: MethodBootstrapToken, Ref: bootstrapRef(tokLaptop), UID: "x", GrantedAt: grantTime}, errHas: "has a uid"},
		{name: "kubernetes ref without name", grant: Grant{Method: MethodKubernetesJWT, Ref: "default/", GrantedAt: grantTime}, errHas: "<namespace>/<name>"},
		{name: "kubernetes ref with two slashes", grant: Grant{Method: MethodKubernetesJWT, Ref: "a/b/c", GrantedAt: grantTime}, errHas: "<namespace>/<name>"},
		{name: "kubernetes ref too long", grant: Grant{Method: MethodKubernetesJWT, Ref: "a/" + strings.Repeat("b", maxGrantRef), GrantedAt: grantTime}, errHas: "more than"},
		{name: "uid too long", grant: Grant{Method: MethodKubernetesJWT, Ref: "a/b", UID: strings.Repeat("u", maxGrantUID+1), GrantedAt: grantTime}, errHas: "more than"},
		{name: "oidc ref is a URL", grant: Grant{Method: MethodOIDC, Ref: "https://issuer.example", GrantedAt: grantTime}, errHas: "not an issuer name"},
		{name: "oidc ref empty", grant: Grant{Method: MethodOIDC, GrantedAt: grantTime}, errHas: "not an issuer name"},
		{name: "oidc ref upper case", grant: Grant{Method: MethodOIDC, Ref: "GitHub", GrantedAt: grantTime}, errHas: "not an issuer name"},
		{name: "issuer ref ends with -", grant: Grant{Method: MethodKubernetesIssuer, Ref: "west-", GrantedAt: grantTime}, errHas: "not an issuer name"},
		{name: "issuer ref too long", grant: Grant{Method: MethodKubernetesIssuer, Ref: strings.Repeat("a", MaxIssuerNameLen+1), GrantedAt: grantTime}, errHas: "not an issuer name"},
		{name: "issuer grant uid not 32 hex digits", grant: Grant{Method: MethodKubernetesIssuer, Ref: "west", UID: "u", GrantedAt: grantTime}, errHas: `kubernetes-issuer grant uid "u" is not 32 lowercase hex digits`},
		{name: "issuer grant without uid", grant: Grant{Method: MethodOIDC, Ref: "ci", GrantedAt: grantTime}, errHas: "is not 32 lowercase hex digits"},
		{name: "issuer grant uid upper case", grant: Grant{Method: MethodOIDC, Ref: "ci", UID: strings.ToUpper(IssuerGrantUID("https://i.example")), GrantedAt: grantTime}, errHas: "is not 32 lowercase hex digits"},
		{name: "issuer grant uid a full digest", grant: Grant{Method: MethodOIDC, Ref: "ci", UID: IssuerGrantUID("https://i.example") + IssuerGrantUID("x"), GrantedAt: grantTime}, errHas: "is not 32 lowercase hex digits"},
		{name: "issuer grant uid the URL", grant: Grant{Method: MethodOIDC, Ref: "ci", UID: "https://i.example/abcdefghijklmno", GrantedAt: grantTime}, errHas: "is not 32 lowercase hex digits"},
		{name: "legacy with ref", grant: Grant{Method: GrantMethodLegacy, Ref: "a/b", GrantedAt: grantTime}, errHas: "legacy grant has"},
		{name: "SDS marker with uid", grant: Grant{Method: GrantMethodSDS, UID: "u", GrantedAt: grantTime}, errHas: "sds-minted grant has"},
		{name: "not UTF-8", grant: Grant{Method: MethodKubernetesJWT, Ref: "a/\xff", GrantedAt: grantTime}, errHas: "UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.grant.Extension()
			require.Error(t, err)
			assert.Contains(t, err.Error(), "authn: grant: ")
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}
}

// TestIssuerGrantUID pins the digest: grants in certificates already
// issued must keep matching their issuer.
func TestIssuerGrantUID(t *testing.T) {
	// printf %s https://token.actions.githubusercontent.com | sha256sum | cut -c1-32
	assert.Equal(t, "dd9c65dd99f49e3d0ff1d11acfec9a12", IssuerGrantUID("https://token.actions.githubusercontent.com"))
	assert.Len(t, IssuerGrantUID(""), 32)
	assert.NotEqual(t, IssuerGrantUID("https://i.example"), IssuerGrantUID("https://i.example/"), "the URL byte for byte, as iss is compared")
}

func TestParseGrantRefuses(t *testing.T) {
	good, err := Grant{Method: GrantMethodLegacy, GrantedAt: grantTime}.Extension()
	require.NoError(t, err)
	marshal := func(v any) []byte {
		der, err := asn1.Marshal(v)
		require.NoError(t, err)
		return der
	}
	tests := []struct {
		name   string
		der    []byte
		errHas string
	}{
		{name: "empty", der: nil, errHas: "authn: grant: "},
		{name: "trailing bytes", der: append(append([]byte{}, good.Value...), 0), errHas: "1 bytes after the value"},
		{name: "version 2", der: marshal(grantASN1{Version: 2, Method: GrantMethodLegacy, GrantedAt: grantTime}), errHas: "version 2"},
		{name: "unknown method", der: marshal(grantASN1{Version: 1, Method: "x509-svid", GrantedAt: grantTime}), errHas: "unknown method"},
		{name: "fields missing", der: marshal(struct{ Version int }{1}), errHas: "authn: grant: "},
		{name: "oversized", der: make([]byte, maxGrantExtension+1), errHas: "more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseGrant(tt.der)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}
}

// grantedLeaf issues a leaf carrying exts, as our CA would.
func grantedLeaf(t *testing.T, ca *testca.CA, exts ...pkix.Extension) *x509.Certificate {
	t.Helper()
	leaf, _ := ca.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) { c.ExtraExtensions = exts }})
	return leaf
}

func TestGrantFromVerifiedSVID(t *testing.T) {
	local := testca.New(t, "example.org")
	boot := Grant{Method: MethodBootstrapToken, Ref: bootstrapRef(tokLaptop), GrantedAt: grantTime}
	ext, err := boot.Extension()
	require.NoError(t, err)
	plain, _ := local.Issue(t, workloadID)

	tests := []struct {
		name      string
		leaf      *x509.Certificate
		want      *Grant
		wantErrIn string
	}{
		{name: "grant copied from the leaf", leaf: grantedLeaf(t, local, ext), want: &boot},
		{name: "no extension is legacy, dated at NotBefore", leaf: plain, want: &Grant{Method: GrantMethodLegacy, GrantedAt: plain.NotBefore.UTC()}},
		{name: "malformed extension", leaf: grantedLeaf(t, local, pkix.Extension{Id: GrantOID, Value: []byte{0x30, 0x00}}), wantErrIn: "authn: grant: "},
	}
	roots := x509bundle.NewSet(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{local.Cert}))
	a := NewX509SVID(localTD, roots, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The second call is answered from the verify cache, which
			// keeps the grant read on the first: the same answer, and
			// each Identity its own copy of the grant.
			var first *Grant
			for call := range 2 {
				id, err := a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{tt.leaf}, Peer: "127.0.0.1:1"})
				require.NoError(t, err, "a grant never decides authentication")
				assert.Equal(t, workloadID, id.ID)
				if tt.wantErrIn != "" {
					assert.Nil(t, id.Grant)
					require.Error(t, id.GrantErr, "call %d", call)
					assert.Contains(t, id.GrantErr.Error(), tt.wantErrIn)
					continue
				}
				assert.NoError(t, id.GrantErr)
				assert.Equal(t, tt.want, id.Grant, "call %d", call)
				if first == nil {
					first = id.Grant
					first.Ref = "changed by the first caller"
				}
			}
		})
	}
	assert.Equal(t, len(tests), a.cache.len(), "each leaf verified once, then answered from the cache")
}

func TestBootstrapGrant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.csv")
	writeTokens(t, path, tokLaptop+",spiffe://example.org/laptop/alice\n"+tokVM+",spiffe://example.org/vm/build\n", 0o600)
	b, err := LoadBootstrapTokens(path, localTD)
	require.NoError(t, err)

	id, err := b.Authenticate(context.Background(), Request{BearerToken: tokLaptop})
	require.NoError(t, err)
	require.NotNil(t, id.Grant)
	assert.Equal(t, Grant{Method: MethodBootstrapToken, Ref: bootstrapRef(tokLaptop)}, *id.Grant, "the token authenticator leaves the time to the issuer")
	assert.NotContains(t, id.Grant.Ref, tokLaptop)
	laptop := *id.Grant
	laptop.GrantedAt = grantTime
	vmGrant := Grant{Method: MethodBootstrapToken, Ref: bootstrapRef(tokVM), GrantedAt: grantTime}

	ctx := context.Background()
	require.NoError(t, b.CheckGrant(ctx, laptopID, laptop))
	require.NoError(t, b.CheckGrant(ctx, vmID, vmGrant))

	tests := []struct {
		name   string
		id     spiffeid.ID
		grant  Grant
		errHas string
	}{
		{name: "token listed for another identity", id: vmID, grant: laptop, errHas: "no longer listed"},
		{name: "not a bootstrap grant", id: laptopID, grant: Grant{Method: MethodKubernetesJWT, Ref: "a/b", GrantedAt: grantTime}, errHas: "not a bootstrap grant"},
		{name: "unknown reference", id: laptopID, grant: Grant{Method: MethodBootstrapToken, Ref: bootstrapRef("gone-0123456789abcdef"), GrantedAt: grantTime}, errHas: "no longer listed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := b.CheckGrant(ctx, tt.id, tt.grant)
			require.ErrorIs(t, err, ErrGrantRevoked)
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}

	t.Run("token removed from the file", func(t *testing.T) {
		writeTokens(t, path, tokVM+",spiffe://example.org/vm/build\n", 0o600)
		require.NoError(t, b.Reload())
		err := b.CheckGrant(ctx, laptopID, laptop)
		require.ErrorIs(t, err, ErrGrantRevoked)
		assert.Contains(t, err.Error(), "is no longer listed in "+path)
		assert.NotContains(t, err.Error(), tokLaptop)
		assert.NoError(t, b.CheckGrant(ctx, vmID, vmGrant), "other tokens still grant")
	})
	t.Run("a failed reload keeps the previous tokens deciding", func(t *testing.T) {
		writeTokens(t, path, "not a token file\n", 0o600)
		require.Error(t, b.Reload())
		assert.NoError(t, b.CheckGrant(ctx, vmID, vmGrant))
	})
}

func TestTokenReviewGrant(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	f := newReviewFixture(t, nil)
	tok := saToken(t, "web", epoch.Add(time.Hour))
	f.api.set(tok, status(authenticationv1.TokenReviewStatus{
		Authenticated: true, Audiences: []string{"example.org"},
		User: authenticationv1.UserInfo{Username: "system:serviceaccount:default:web", UID: "uid-web-1"},
	}))
	want := &Grant{Method: MethodKubernetesJWT, Ref: "default/web", UID: "uid-web-1"}
	for _, name := range []string{"reviewed", "cached"} {
		id, err := f.auth(tok)
		require.NoError(t, err, name)
		assert.Equal(t, want, id.Grant, name)
	}
	assert.EqualValues(t, 1, f.api.calls.Load())
}

// serviceAccount is the API object; only metadata matters to grants.
func serviceAccount(ns, name, uid string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
}

func TestServiceAccountGrants(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cs := fake.NewClientset(serviceAccount("default", "web", "uid-web-1"), serviceAccount("prod", "db", "uid-db-1"))
	s, err := NewServiceAccountGrants(ServiceAccountGrantsConfig{Client: cs})
	require.NoError(t, err)
	ctx := context.Background()
	web := Grant{Method: MethodKubernetesJWT, Ref: "default/web", UID: "uid-web-1", GrantedAt: grantTime}

	err = s.CheckGrant(ctx, workloadID, web)
	require.ErrorIs(t, err, ErrUnavailable, "fails closed, retryable, until the first list")
	assert.NotErrorIs(t, err, ErrGrantRevoked)

	deleted := make(chan struct{})
	_, err = s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { close(deleted) }})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	require.True(t, cache.WaitForCacheSync(ctx.Done(), s.HasSynced))

	dbID := spiffeid.RequireFromString("spiffe://example.org/ns/prod/sa/db")
	tests := []struct {
		name    string
		id      spiffeid.ID
		grant   Grant
		wantErr error
		errHas  string
	}{
		{name: "exists with the same uid", id: workloadID, grant: web},
		{name: "no uid recorded: existence decides", id: workloadID, grant: Grant{Method: MethodKubernetesJWT, Ref: "default/web", GrantedAt: grantTime}},
		{name: "re-created", id: workloadID, grant: Grant{Method: MethodKubernetesJWT, Ref: "default/web", UID: "uid-web-0", GrantedAt: grantTime}, wantErr: ErrGrantRevoked, errHas: "deleted and re-created"},
		{name: "never existed", id: spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/ghost"), grant: Grant{Method: MethodKubernetesJWT, Ref: "default/ghost", GrantedAt: grantTime}, wantErr: ErrGrantRevoked, errHas: "was deleted"},
		{name: "grant names another account", id: dbID, grant: web, wantErr: ErrGrantRevoked, errHas: "not the one of"},
		{name: "not a service account grant", id: workloadID, grant: Grant{Method: MethodBootstrapToken, Ref: bootstrapRef(tokLaptop), GrantedAt: grantTime}, wantErr: ErrGrantRevoked, errHas: "not a service account grant"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.CheckGrant(ctx, tt.id, tt.grant)
			if tt.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.wantErr)
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}

	t.Run("an account the informer has not seen yet is confirmed with the API", func(t *testing.T) {
		fresh := Grant{Method: MethodKubernetesJWT, Ref: "default/fresh", UID: "uid-fresh", GrantedAt: grantTime}
		freshID := spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/fresh")
		client, limiter := s.client, s.confirm
		defer func() { s.client, s.confirm = client, limiter }()
		s.client = fake.NewClientset(serviceAccount("default", "fresh", "uid-fresh"))
		require.NoError(t, s.CheckGrant(ctx, freshID, fresh))

		s.confirm = rate.NewLimiter(0, 0)
		// Beyond the confirmation rate (which callers with revoked grants can
		// spend) the cache's no is a retryable refusal, never a final one.
		err := s.CheckGrant(ctx, freshID, fresh)
		require.ErrorIs(t, err, ErrUnavailable)
		assert.NotErrorIs(t, err, ErrGrantRevoked)
	})
	t.Run("deleted", func(t *testing.T) {
		require.NoError(t, cs.CoreV1().ServiceAccounts("default").Delete(ctx, "web", metav1.DeleteOptions{}))
		<-deleted
		err := s.CheckGrant(ctx, workloadID, web)
		require.ErrorIs(t, err, ErrGrantRevoked)
		assert.Contains(t, err.Error(), "service account default/web that granted spiffe://example.org/ns/default/sa/web was deleted")

		// Confirmed once, the refusal is remembered: a revoked caller that
		// keeps calling spends no confirmation budget, and stays revoked
		// (not merely unavailable) when the budget is gone.
		limiter := s.confirm
		defer func() { s.confirm = limiter }()
		s.confirm = rate.NewLimiter(0, 0)
		for range 3 {
			err = s.CheckGrant(ctx, workloadID, web)
			require.ErrorIs(t, err, ErrGrantRevoked)
			assert.NotErrorIs(t, err, ErrUnavailable)
		}
	})
}

func FuzzParseGrant(f *testing.F) {
	for _, g := range []Grant{
		{Method: MethodBootstrapToken, Ref: bootstrapRef(tokLaptop), GrantedAt: grantTime},
		{Method: MethodKubernetesJWT, Ref: "default/web", UID: "uid", GrantedAt: grantTime},
		{Method: GrantMethodLegacy, GrantedAt: grantTime},
		{Method: GrantMethodSDS, GrantedAt: grantTime},
	} {
		ext, err := g.Extension()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(ext.Value)
	}
	f.Add([]byte{})
	f.Add([]byte{0x30, 0x00})
	f.Add([]byte{0x30, 0x80, 0x02, 0x01, 0x01, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, der []byte) {
		g, err := ParseGrant(der)
		if err != nil {
			return
		}
		// Whatever parses is a grant Extension would write, and writes
		// back to the same bytes: one encoding per grant.
		ext, err := g.Extension()
		if err != nil {
			t.Fatalf("parsed grant %+v does not encode: %v", g, err)
		}
		if string(ext.Value) != string(der) {
			t.Fatalf("grant %+v re-encodes differently", g)
		}
	})
}

func TestServiceAccountGrantsListRefused(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cs := fake.NewClientset()
	cs.PrependReactor("list", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "serviceaccounts"}, "", errors.New("RBAC: access denied"))
	})
	var logs testlog.Buffer
	warned := make(chan struct{})
	var once sync.Once
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		n, err := logs.Write(p)
		once.Do(func() { close(warned) })
		return n, err
	}), nil))
	s, err := NewServiceAccountGrants(ServiceAccountGrantsConfig{Client: cs, Logger: logger})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-warned
	cancel()
	require.NoError(t, <-done)
	assert.Contains(t, logs.String(), "cannot list service accounts")
	assert.Contains(t, logs.String(), "RBAC: get, list, watch serviceaccounts")
	err = s.CheckGrant(context.Background(), workloadID, Grant{Method: MethodKubernetesJWT, Ref: "default/web", GrantedAt: grantTime})
	require.ErrorIs(t, err, ErrUnavailable)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
