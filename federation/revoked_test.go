package federation

import (
	"bytes"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// docListing renders b at seq with revs in trustbridge_revoked, spliced
// in by hand so that a document bundledoc would refuse to write (one
// listing an authority it carries) can be served too.
func docListing(t *testing.T, b *spiffebundle.Bundle, seq uint64, revs ...bundledoc.Revocation) []byte {
	t.Helper()
	doc := docWith(t, b, seq)
	if len(revs) == 0 {
		return doc
	}
	member, err := bundledoc.MarshalWithRevocations(spiffebundle.New(b.TrustDomain()), revs)
	require.NoError(t, err)
	i := bytes.Index(member, []byte(`,"`+bundledoc.RevokedMember+`"`))
	require.Positive(t, i)
	return append(doc[:len(doc)-1:len(doc)-1], member[i:]...)
}

func bundleOf(t *testing.T, certs []*x509.Certificate, kids ...string) *spiffebundle.Bundle {
	t.Helper()
	b := spiffebundle.FromX509Authorities(fetchTD0, certs)
	for _, kid := range kids {
		require.NoError(t, b.AddJWTAuthority(kid, testca.NewKey(t, testca.ECP256).Public()))
	}
	return b
}

var fetchTD0 = td(fetchTD)

func revokeRoot(c *x509.Certificate, until time.Time) bundledoc.Revocation {
	return bundledoc.Revocation{Use: bundledoc.UseX509SVID, X5TS256: bundledoc.X509Thumbprint(c), NotAfter: until.Truncate(time.Second).UTC()}
}

func revokeKID(kid string, until time.Time) bundledoc.Revocation {
	return bundledoc.Revocation{Use: bundledoc.UseJWTSVID, KID: kid, NotAfter: until.Truncate(time.Second).UTC()}
}

// refusedAsRevoked checks that the last poll refused the served bundle
// as ErrRevokedAuthority, with keep still trusted and the refusal
// visible in the status and the metric.
func refusedAsRevoked(t *testing.T, pf *pollFixture, p *Poller, keep *spiffebundle.Bundle, refusals int, msg ...string) {
	t.Helper()
	err := p.Refresh(t.Context(), fetchTD0)
	require.ErrorIs(t, err, ErrRevokedAuthority)
	assert.True(t, keep.Equal(pf.sink.get(SourceName(fetchTD0))), "the last good bundle is kept")
	st := p.Status()[0]
	assert.Equal(t, StateFailing, st.State)
	for _, m := range msg {
		assert.Contains(t, st.LastError, m)
	}
	assert.Equal(t, uint64(refusals), st.Refusals["revoked_authority"])
	assert.Equal(t, float64(refusals), testutil.ToFloat64(p.metrics.fetches.WithLabelValues(fetchTD, "revoked_authority")))
}

func serveAt(t *testing.T, pf *pollFixture, b *spiffebundle.Bundle, seq uint64, revs ...bundledoc.Revocation) *spiffebundle.Bundle {
	t.Helper()
	pf.srv.set(serveDoc(docListing(t, b, seq, revs...)))
	c := b.Clone()
	c.SetSequenceNumber(seq)
	return c
}

// (a) A peer that accepted a bundle revoking a root refuses a later one,
// higher sequence and all, that brings the root back.
func TestPollerRefusesARevokedRootBroughtBack(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.poller(t)
	old, next := pf.fx.ca.Cert, testca.New(t, fetchTD).Cert
	until := pf.now.Add(24 * time.Hour)

	serveAt(t, pf, bundleOf(t, []*x509.Certificate{old, next}), 7)
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	revoked := serveAt(t, pf, bundleOf(t, []*x509.Certificate{next}), 8, revokeRoot(old, until))
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	require.True(t, revoked.Equal(pf.sink.get(SourceName(fetchTD0))))
	st := p.Status()[0]
	require.Len(t, st.Revoked, 1)
	assert.Equal(t, uint64(8), *st.Revoked[0].Sequence)

	// The publisher restored a backup from before the revocation and
	// bumped the sequence past it.
	serveAt(t, pf, bundleOf(t, []*x509.Certificate{old, next}), 9)
	refusedAsRevoked(t, pf, p, revoked, 1, "X.509 authority x5t#S256 "+bundledoc.X509Thumbprint(old),
		"listed since sequence 8", "restored from before the revocation")

	// Later bundles need not list it again: the set is the union.
	later := serveAt(t, pf, bundleOf(t, []*x509.Certificate{next}), 10)
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	require.True(t, later.Equal(pf.sink.get(SourceName(fetchTD0))))
	serveAt(t, pf, bundleOf(t, []*x509.Certificate{old, next}), 11)
	refusedAsRevoked(t, pf, p, later, 2)
}

// (b) The same for a JWT authority, by kid.
func TestPollerRefusesARevokedKIDBroughtBack(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.poller(t)
	root := []*x509.Certificate{pf.fx.ca.Cert}
	serveAt(t, pf, bundleOf(t, root, "k1", "k2"), 7)
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	revoked := serveAt(t, pf, bundleOf(t, root, "k2"), 8, revokeKID("k1", pf.now.Add(time.Hour)))
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))

	serveAt(t, pf, bundleOf(t, root, "k1", "k2"), 9)
	refusedAsRevoked(t, pf, p, revoked, 1, `JWT authority kid "k1"`)
}

// (c) The revoked set persists with the last-known-good bundle: a
// restarted peer still refuses the revoked root.
func TestPollerRestartKeepsTheRevokedSet(t *testing.T) {
	pf := newPollFixture(t)
	old, next := pf.fx.ca.Cert, testca.New(t, fetchTD).Cert
	p := pf.poller(t)
	serveAt(t, pf, bundleOf(t, []*x509.Certificate{old, next}), 7)
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	revoked := serveAt(t, pf, bundleOf(t, []*x509.Certificate{next}), 8, revokeRoot(old, pf.now.Add(time.Hour)))
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))

	pf.sink, pf.reg = &memSink{}, prometheus.NewRegistry()
	restarted := pf.poller(t)
	require.Empty(t, restarted.LoadLastKnownGood())
	require.True(t, revoked.Equal(pf.sink.get(SourceName(fetchTD0))))
	require.Len(t, restarted.Status()[0].Revoked, 1, "restored with the bundle")
	assert.Len(t, restarted.Revoked(fetchTD0), 1)
	unpolled, err := NewPoller(PollerConfig{Sink: &memSink{}, LKG: NewLKGStore(pf.dataDir), Now: func() time.Time { return pf.now }})
	require.NoError(t, err)
	assert.Len(t, unpolled.Revoked(fetchTD0), 1, "from the store, for a trust domain not polled (bundle set)")
	serveAt(t, pf, bundleOf(t, []*x509.Certificate{old, next}), 9)
	refusedAsRevoked(t, pf, restarted, revoked, 1, "listed since sequence 8")

	// A stored entry whose bundle carries a revoked root is not taken.
	e, err := NewLKGStore(pf.dataDir).Load(fetchTD0)
	require.NoError(t, err)
	e.Bundle = bundleOf(t, []*x509.Certificate{old, next})
	e.Bundle.SetSequenceNumber(20)
	require.NoError(t, restarted.LoadLastKnownGoodFor(fetchTD0), "the same entry again")
	require.NoError(t, NewLKGStore(pf.dataDir).Save(*e))
	require.ErrorIs(t, restarted.LoadLastKnownGoodFor(fetchTD0), ErrRevokedAuthority)
	assert.True(t, revoked.Equal(pf.sink.get(SourceName(fetchTD0))))
}

// (d) Entries past their exp are forgotten: the authority expired, so
// refusing it protects nothing.
func TestPollerPrunesExpiredRevocations(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.poller(t)
	old, next := pf.fx.ca.Cert, testca.New(t, fetchTD).Cert
	serveAt(t, pf, bundleOf(t, []*x509.Certificate{next}), 8, revokeRoot(old, pf.now.Add(time.Hour)))
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	require.Len(t, p.Status()[0].Revoked, 1)

	pf.now = pf.now.Add(time.Hour + time.Second)
	back := serveAt(t, pf, bundleOf(t, []*x509.Certificate{old, next}), 9)
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	assert.True(t, back.Equal(pf.sink.get(SourceName(fetchTD0))))
	assert.Empty(t, p.Status()[0].Revoked)
	e, err := NewLKGStore(pf.dataDir).Load(fetchTD0)
	require.NoError(t, err)
	assert.Empty(t, e.Revoked, "pruned in the store too")
}

// (e) A bundle that lists an authority as revoked and carries it is
// refused: one of the two is a mistake, and either way it is unsafe.
func TestPollerRefusesABundleRevokingWhatItCarries(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.poller(t)
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	old, next := pf.fx.ca.Cert, testca.New(t, fetchTD).Cert
	serveAt(t, pf, bundleOf(t, []*x509.Certificate{old, next}), 8, revokeRoot(next, pf.now.Add(time.Hour)))
	refusedAsRevoked(t, pf, p, pf.fx.bundle, 1, "and carries it too")
	assert.Empty(t, p.Status()[0].Revoked, "nothing learned from a refused bundle")

	_, _, _, err := CheckDocument(fetchTD0, docListing(t, bundleOf(t, []*x509.Certificate{old}, "k"), 8, revokeKID("k", pf.now.Add(time.Hour))), nil, false)
	assert.ErrorIs(t, err, ErrRevokedAuthority, "bundle inspect says the same")
}

// A bundle that brings new revocations on the same keys is confirmed,
// and the set is saved so a restart keeps it.
func TestPollerSavesRevocationsOnUnchangedKeys(t *testing.T) {
	pf := newPollFixture(t)
	p := pf.poller(t)
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	gone := testca.New(t, fetchTD).Cert
	pf.srv.set(serveDoc(docListing(t, pf.fx.bundle, 7, revokeRoot(gone, pf.now.Add(time.Hour)))))
	require.NoError(t, p.Refresh(t.Context(), fetchTD0))
	e, err := NewLKGStore(pf.dataDir).Load(fetchTD0)
	require.NoError(t, err)
	require.Len(t, e.Revoked, 1)
	assert.Equal(t, bundledoc.X509Thumbprint(gone), e.Revoked[0].X5TS256)
}

func TestUnionAndPruneRevoked(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	seq := uint64(3)
	a := Revoked{Revocation: revokeKID("a", t0.Add(time.Hour)), Sequence: &seq, Since: t0}
	b := Revoked{Revocation: revokeKID("b", t0.Add(2*time.Hour)), Since: t0}
	later := Revoked{Revocation: revokeKID("a", t0.Add(3*time.Hour)), Since: t0.Add(time.Minute)}

	got, changed := unionRevoked([]Revoked{b}, []Revoked{a})
	assert.True(t, changed)
	assert.Equal(t, []Revoked{a, b}, got, "sorted")
	got2, changed := unionRevoked(got, []Revoked{a})
	assert.False(t, changed)
	assert.Equal(t, got, got2)
	got3, changed := unionRevoked(got, []Revoked{later})
	assert.True(t, changed)
	assert.Equal(t, t0.Add(3*time.Hour), got3[0].NotAfter, "the later exp")
	assert.Equal(t, t0, got3[0].Since, "first listed stays")
	assert.Equal(t, t0.Add(time.Hour), got[0].NotAfter, "the input is not modified")

	for _, tc := range []struct {
		now  time.Time
		want []Revoked
	}{
		{t0, []Revoked{a, b}},
		{t0.Add(time.Hour), []Revoked{a, b}},
		{t0.Add(time.Hour + time.Second), []Revoked{b}},
		{t0.Add(3 * time.Hour), []Revoked{}},
	} {
		assert.Equal(t, tc.want, pruneRevoked([]Revoked{a, b}, tc.now), "at %s", tc.now)
	}
}

func TestStoredRevokedRoundTrip(t *testing.T) {
	seq := uint64(9)
	held := []Revoked{
		{Revocation: revokeKID("k<1>", time.Unix(1767225600, 0)), Since: time.Unix(1767000000, 0).UTC()},
		{Revocation: revokeRoot(testca.New(t, fetchTD).Cert, time.Unix(1767225600, 0)), Sequence: &seq, Since: time.Unix(1767000000, 0).UTC()},
	}
	held, _ = unionRevoked(nil, held)
	raw, err := MarshalRevoked(held)
	require.NoError(t, err)
	got, err := ParseStoredRevoked(raw)
	require.NoError(t, err)
	assert.Equal(t, held, got)

	none, err := ParseStoredRevoked(nil)
	require.NoError(t, err)
	assert.Nil(t, none, "an entry from before issue 38")
	for _, bad := range []string{`{}`, `[{"use":"jwt-svid","kid":"","exp":1}]`, `[{"use":"x509-svid","x5t#S256":"AA","exp":1}]`, `[{"use":"jwt-svid","kid":"k"}]`} {
		_, err := ParseStoredRevoked([]byte(bad))
		assert.Error(t, err, bad)
		assert.True(t, strings.HasPrefix(err.Error(), "revoked"), err.Error())
	}
}

// An LKG file written before issue 38 (no "revoked" member) still loads.
func TestLoadLKGWithoutRevoked(t *testing.T) {
	pf := newPollFixture(t)
	store := NewLKGStore(pf.dataDir)
	require.NoError(t, store.Save(LKGEntry{TrustDomain: fetchTD0, Bundle: pf.fx.bundle, FetchedAt: pf.now}))
	e, err := store.Load(fetchTD0)
	require.NoError(t, err)
	assert.Nil(t, e.Revoked)
	assert.True(t, pf.fx.bundle.Equal(e.Bundle))
}

// A stored entry whose revoked set names an authority of its own bundle
// (an edited store) is refused like a corrupt one: reported, not trusted.
func TestPollerRefusesAStoredEntryRevokingItsOwnRoot(t *testing.T) {
	pf := newPollFixture(t)
	require.NoError(t, NewLKGStore(pf.dataDir).Save(LKGEntry{TrustDomain: fetchTD0, Bundle: pf.fx.bundle, FetchedAt: pf.now,
		Revoked: []Revoked{{Revocation: revokeRoot(pf.fx.ca.Cert, pf.now.Add(time.Hour)), Since: pf.now.UTC()}}}))
	p := pf.poller(t)
	errs := p.LoadLastKnownGood()
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], ErrRevokedAuthority)
	assert.Nil(t, pf.sink.get(SourceName(fetchTD0)), "nothing trusted from it")
	assert.Len(t, p.Revoked(fetchTD0), 1, "its revocations are known all the same")
}

// TestPollerBootstrapWithoutRevoked: a stored entry refused for carrying
// a root its trust domain revoked leaves the relationship on its
// bootstrap bundle, which is often the same old root: it is trusted
// without the revoked authorities (nothing, when none is left), never
// with them, also once the endpoint is reconfigured.
func TestPollerBootstrapWithoutRevoked(t *testing.T) {
	pf := newPollFixture(t)
	other := testca.New(t, fetchTD0.Name())
	pf.ep.BootstrapBundle = spiffebundle.FromX509Authorities(fetchTD0, []*x509.Certificate{pf.fx.ca.Cert, other.Cert})
	require.NoError(t, NewLKGStore(pf.dataDir).Save(LKGEntry{TrustDomain: fetchTD0, Bundle: pf.fx.bundle, FetchedAt: pf.now,
		Revoked: []Revoked{{Revocation: revokeRoot(pf.fx.ca.Cert, pf.now.Add(time.Hour)), Since: pf.now.UTC()}}}))
	p := pf.poller(t)
	require.Len(t, p.LoadLastKnownGood(), 1)
	held := pf.sink.get(SourceName(fetchTD0))
	require.NotNil(t, held, "the bootstrap bundle is held")
	assert.False(t, held.HasX509Authority(pf.fx.ca.Cert), "without the revoked root")
	assert.True(t, held.HasX509Authority(other.Cert))

	// A bootstrap bundle of the revoked root alone leaves nothing trusted.
	pf = newPollFixture(t)
	pf.ep.BootstrapBundle = spiffebundle.FromX509Authorities(fetchTD0, []*x509.Certificate{pf.fx.ca.Cert})
	require.NoError(t, NewLKGStore(pf.dataDir).Save(LKGEntry{TrustDomain: fetchTD0, Bundle: pf.fx.bundle, FetchedAt: pf.now,
		Revoked: []Revoked{{Revocation: revokeRoot(pf.fx.ca.Cert, pf.now.Add(time.Hour)), Since: pf.now.UTC()}}}))
	p = pf.poller(t)
	require.Len(t, p.LoadLastKnownGood(), 1)
	assert.Nil(t, pf.sink.get(SourceName(fetchTD0)), "nothing trusted")
}
