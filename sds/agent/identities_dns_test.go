package agent

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// dnsFetcher is a fakeFetcher that takes IdentityRequests: it issues the
// DNS names asked for (none with leaveOut), and refuses, as the server
// would, the requests of the name sets in denied.
type dnsFetcher struct {
	*fakeFetcher
	mu       sync.Mutex
	asked    []string // "id names"
	denied   map[string]bool
	leaveOut bool
}

func (f *dnsFetcher) FetchIdentity(ctx context.Context, req IdentityRequest, key crypto.Signer) ([]*x509.Certificate, error) {
	names := strings.Join(req.DNSNames, ",")
	f.mu.Lock()
	f.asked = append(f.asked, req.ID.String()+" "+names)
	denied, leaveOut := f.denied[names], f.leaveOut
	f.mu.Unlock()
	if denied {
		return nil, status.Error(codes.PermissionDenied, "the identity map gives no pod of this node "+names)
	}
	if _, err := f.FetchX509SVID(ctx, req.ID, key); err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(f.t), NotBefore: time.Now(), NotAfter: time.Now().Add(f.ttl),
		KeyUsage: x509.KeyUsageDigitalSignature, URIs: []*url.URL{req.ID.URL()},
	}
	if !leaveOut {
		tmpl.DNSNames = req.DNSNames
	}
	return []*x509.Certificate{testca.Sign(f.t, tmpl, f.ca.Cert, key.Public(), f.ca.Key)}, nil
}

func (f *dnsFetcher) deny(names string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.denied == nil {
		f.denied = map[string]bool{}
	}
	f.denied[names] = true
}

func (f *dnsFetcher) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.asked)
}

func acquireNames(t *testing.T, c *IdentityCache, id spiffeid.ID, names ...string) *IdentityHandle {
	t.Helper()
	h, err := c.AcquireIdentity(t.Context(), IdentityRequest{ID: id, DNSNames: names})
	require.NoError(t, err)
	t.Cleanup(h.Release)
	return h
}

// One SPIFFE ID with other DNS names (two pods the map gives the same ID
// and their own names) is another certificate: neither workload is served
// the other's name. The ID's trust is followed once while any of them is
// held; a renewal the server refuses revokes that certificate only, a
// revocation of the ID all of them.
func TestIdentityCacheDNSNamesAreCertificatesOfTheirOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &dnsFetcher{fakeFetcher: newFakeFetcher(t, time.Hour)}
		var mu sync.Mutex
		running := 0
		companion := func(ctx context.Context, id spiffeid.ID) {
			mu.Lock()
			running++
			mu.Unlock()
			<-ctx.Done()
			mu.Lock()
			running--
			mu.Unlock()
		}
		companions := func() int {
			mu.Lock()
			defer mu.Unlock()
			return running
		}
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f, Rand: fixedRand(0.5), Companion: companion})
		startServing(t, c.Run)

		a := acquireNames(t, c, webID, "a.web.shop.svc")
		b := acquireNames(t, c, webID, "b.web.shop.svc")
		plain := acquireNames(t, c, webID)
		assert.Equal(t, []string{"a.web.shop.svc"}, credOf(t, a).Chain[0].DNSNames)
		assert.Equal(t, []string{"b.web.shop.svc"}, credOf(t, b).Chain[0].DNSNames)
		assert.Empty(t, credOf(t, plain).Chain[0].DNSNames)
		assert.Equal(t, []string{webID.String() + " a.web.shop.svc", webID.String() + " b.web.shop.svc", webID.String() + " "}, f.requests())
		assert.Same(t, credOf(t, a), credOf(t, acquireNames(t, c, webID, "a.web.shop.svc")), "the same names share one certificate")
		synctest.Wait()
		assert.Equal(t, 1, companions(), "one trust stream per ID, whatever its names")

		f.deny("a.web.shop.svc")
		time.Sleep(31 * time.Minute)
		synctest.Wait()
		_, err := a.Credential(t.Context(), webID)
		require.ErrorIs(t, err, ErrIdentityRevoked, "the server refused a's renewal")
		assert.ErrorContains(t, err, "a.web.shop.svc")
		_, err = b.Credential(t.Context(), webID)
		require.NoError(t, err, "b is decided on its own")
		assert.Equal(t, 1, companions(), "b and plain still hold the ID's trust")

		c.Revoke(webID, errors.New("the trust stream was refused"))
		for _, h := range []*IdentityHandle{b, plain} {
			_, err = h.Credential(t.Context(), webID)
			require.ErrorIs(t, err, ErrIdentityRevoked)
		}
		synctest.Wait()
		assert.Equal(t, 0, companions(), "no certificate of the ID left: its trust is no longer followed")
	})
}

// A certificate without a DNS name asked for is refused (the server's
// answer is checked, not trusted), and a fetcher that cannot ask for DNS
// names is never asked for an identity that has some: the workload would
// get a certificate without the names its rules give it.
func TestIdentityCacheRefusesCertificatesWithoutTheirNames(t *testing.T) {
	f := &dnsFetcher{fakeFetcher: newFakeFetcher(t, time.Hour), leaveOut: true}
	c := newTestCache(t, IdentityCacheConfig{Fetcher: f})
	startServing(t, c.Run)
	_, err := c.AcquireIdentity(t.Context(), IdentityRequest{ID: webID, DNSNames: []string{"web.shop.svc"}})
	require.ErrorIs(t, err, errUnusable)
	assert.ErrorContains(t, err, "without the DNS name web.shop.svc")

	plain := newFakeFetcher(t, time.Hour)
	c = newTestCache(t, IdentityCacheConfig{Fetcher: plain})
	startServing(t, c.Run)
	_, err = c.AcquireIdentity(t.Context(), IdentityRequest{ID: webID, DNSNames: []string{"web.shop.svc"}})
	require.Error(t, err)
	assert.ErrorContains(t, err, "cannot ask for the DNS names web.shop.svc")
	assert.Equal(t, 0, plain.callsFor(webID))
}

// The fetcher asks for a workload's DNS names in its CSR, exactly, and
// refuses an answer without one of them.
func TestImpersonationFetcherAsksForDNSNames(t *testing.T) {
	caA := testca.New(t, tdA.Name())
	names := []string{"a.web.shop.svc", "web.shop.svc"}
	for name, tt := range map[string]struct {
		issued []string
		err    string
	}{
		"granted":                {issued: names},
		"granted, with more":     {issued: append([]string{"web.shop.example"}, names...)},
		"a name the CA left out": {issued: names[:1], err: "the server left out the DNS name web.shop.svc"},
	} {
		t.Run(name, func(t *testing.T) {
			var asked []string
			addr := startFakeCertService(t, caA, func(t *testing.T, csr *x509.CertificateRequest) *x509.Certificate {
				asked = csr.DNSNames
				return testca.Sign(t, &x509.Certificate{
					SerialNumber: serial(t), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
					KeyUsage: x509.KeyUsageDigitalSignature, URIs: []*url.URL{webID.URL()}, DNSNames: tt.issued,
				}, caA.Cert, csr.PublicKey, caA.Key)
			})
			f, err := NewImpersonationFetcher(ImpersonationConfig{CAAddr: addr, Node: func() (NodeCredentials, error) {
				return NodeCredentials{Token: nodeToken, Roots: []*x509.Certificate{caA.Cert}, ServerID: serverID}, nil
			}})
			require.NoError(t, err)
			chain, err := f.FetchIdentity(t.Context(), IdentityRequest{ID: webID, DNSNames: names}, newKey(t))
			assert.Equal(t, names, asked, "the CSR names exactly the workload's DNS names")
			if tt.err != "" {
				require.ErrorIs(t, err, errUnusable)
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.issued, chain[0].DNSNames)
		})
	}
}

// namingAttestor identifies every caller as id with names, as the
// identity map would.
type namingAttestor struct {
	switchingAttestor
	names atomic.Pointer[[]string]
}

func (s *namingAttestor) Identify(context.Context, authn.Request) (identitymap.Identity, error) {
	return identitymap.Identity{ID: *s.id.Load(), DNSNames: *s.names.Load()}, nil
}

// A stream attested with DNS names holds the certificate with those
// names, and the SDS server learns them (authn.Identity.DNSNames); one
// re-attested with other names (a label changed) ends, as for another
// ID: never kept on names it no longer has.
func TestNodeAuthenticatorDNSNamesChanged(t *testing.T) {
	f := newNodeTrustFixture(t)
	fetcher := &dnsFetcher{fakeFetcher: newFakeFetcher(t, time.Hour)}
	cache := newTestCache(t, IdentityCacheConfig{Fetcher: fetcher, Rand: fixedRand(0.5), Companion: f.nt.follow})
	startServing(t, cache.Run)
	att := &namingAttestor{}
	att.id.Store(&webID)
	a := []string{"a.web.shop.svc"}
	att.names.Store(&a)
	n := &nodeAuthenticator{attested: att, cache: cache, trust: f.nt}

	ctx, end := context.WithCancel(t.Context())
	defer end()
	type result struct {
		ident authn.Identity
		err   error
	}
	done := make(chan result, 1)
	go func() {
		ident, err := n.Authenticate(ctx, authn.Request{})
		done <- result{ident, err}
	}()
	f.srv.next(t).send(t, wtrust([]*spiffebundle.Bundle{f.local.Bundle()}, nil))
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, a, r.ident.DNSNames, "the SDS server asks the credential source for these names")
	assert.Equal(t, a, n.holds.held(ctx).DNSNames())

	b := []string{"b.web.shop.svc"}
	att.names.Store(&b)
	_, err := n.Authenticate(ctx, authn.Request{})
	require.ErrorIs(t, err, authn.ErrNotAttested)
	assert.ErrorContains(t, err, "now attests as "+webID.String()+" (DNS names b.web.shop.svc), not "+webID.String()+" (DNS names a.web.shop.svc); reconnect")
	assert.Equal(t, []string{webID.String() + " a.web.shop.svc"}, fetcher.requests(), "the new names are left to the new stream")
}

// The cache's credential source serves an SDS stream the certificate of
// its identity's DNS names: the stream of a workload with names never
// gets the same ID's certificate without them, or with another's.
func TestCredentialSourceServesTheNames(t *testing.T) {
	fetcher := &dnsFetcher{fakeFetcher: newFakeFetcher(t, time.Hour)}
	c := newTestCache(t, IdentityCacheConfig{Fetcher: fetcher})
	startServing(t, c.Run)
	src, ok := c.CredentialSource().(sds.IdentityCredentialSource)
	require.True(t, ok, "the SDS server asks CredentialFor")

	named, endNamed := context.WithCancel(t.Context())
	defer endNamed()
	cred, err := src.CredentialFor(named, authn.Identity{ID: webID, DNSNames: []string{"a.web.shop.svc"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"a.web.shop.svc"}, cred.Chain[0].DNSNames)

	plain, endPlain := context.WithCancel(t.Context())
	defer endPlain()
	cred, err = c.CredentialSource().Credential(plain, webID)
	require.NoError(t, err)
	assert.Empty(t, cred.Chain[0].DNSNames)
}
