package ca

import (
	"crypto/x509"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// hookClock is a fake clock that runs a hook, once, inside the next call
// to Now: what another goroutine might do between a signer's loading a
// snapshot and its reading the time, made deterministic.
type hookClock struct {
	*clocktesting.FakeClock
	hook atomic.Pointer[func()]
}

func (c *hookClock) Now() time.Time {
	if f := c.hook.Swap(nil); f != nil {
		(*f)()
	}
	return c.FakeClock.Now()
}

// arm makes the next Now run f first.
func (c *hookClock) arm(f func()) { c.hook.Store(&f) }

// TestBoardReadAfterChange: a change that begins and ends between a
// reader's loading the snapshot and its reading the time sends the reader
// to the change's snapshot, with a time read after it; otherwise the
// reader signs with the old snapshot at a time the change may have
// retired its root before.
func TestBoardReadAfterChange(t *testing.T) {
	clk := &hookClock{FakeClock: clocktesting.NewFakeClock(t0)}
	first, next := &signingSnapshot{}, &signingSnapshot{}
	b := newBoard(first)

	s, now := b.read(clk)
	assert.Same(t, first, s, "no change: the published snapshot")
	assert.Equal(t, t0, now)

	clk.arm(func() {
		b.begin()
		clk.Step(time.Hour) // the change reads its time here
		b.end(next)
		clk.Step(time.Minute)
	})
	s, now = b.read(clk)
	assert.Same(t, next, s, "the change's result, not the snapshot loaded before it")
	assert.Equal(t, t0.Add(time.Hour+time.Minute), now, "a time read after the change")
	assert.Same(t, next, b.load())
}

// TestBoardLoadWaitsForChange: a change under way holds readers off
// until its result is published, so a subscriber the change signalled
// reads that result.
func TestBoardLoadWaitsForChange(t *testing.T) {
	first, next := &signingSnapshot{}, &signingSnapshot{}
	b := newBoard(first)
	b.begin()
	got := make(chan *signingSnapshot)
	go func() { got <- b.load() }()
	select {
	case s := <-got:
		t.Fatalf("load returned %p during a change", s)
	default:
	}
	b.end(next)
	assert.Same(t, next, <-got, "the change's result")
}

// TestSigningNeverCrossesARetirement: a rotation that activates a new
// root, retiring the old one, runs while a signing has loaded the
// snapshot with the old root active but not yet read the time; the clock
// then moves past the retirement margin. Signed with the old root at that
// time, the leaf would outlive the RemoveAfter computed for it: the
// signing must use the new root.
func TestSigningNeverCrossesARetirement(t *testing.T) {
	clk := &hookClock{FakeClock: clocktesting.NewFakeClock(t0)}
	cfg := testConfig(t, clk.FakeClock)
	cfg.Clock = clk
	a, err := New(cfg)
	require.NoError(t, err)
	first := issuerOf(t, a)
	require.NoError(t, a.Rotate())
	require.NoError(t, a.Reconcile()) // publishes the successor: its lead starts

	ran := false
	clk.arm(func() {
		ran = true
		clk.Step(PublishLead*cfg.RefreshHint + time.Second)
		assert.NoError(t, a.Reconcile())
		clk.Step(2 * retireMargin)
	})
	id := spiffeid.RequireFromPath(tdExample, "/w")
	issued, err := a.Sign(workloadCSR(t, id), id, a.MaxWorkloadTTL())
	require.NoError(t, err)
	require.True(t, ran, "the rotation ran inside the signing")

	roots := a.Roots()
	require.Len(t, roots, 2)
	require.Equal(t, castate.StateRetired, roots[0].State)
	require.True(t, roots[0].Cert.Equal(first))
	require.Equal(t, castate.StateActive, roots[1].State)
	require.True(t, issued.Leaf.NotAfter.After(roots[0].RemoveAfter),
		"the leaf, signed at the time read after the rotation, would outlive the retired root (else this test proves nothing)")
	assert.NoError(t, issued.Leaf.CheckSignatureFrom(roots[1].Cert), "signed by the root the rotation activated")
}

// TestSigningWhileRotating signs X509-SVIDs and JWT-SVIDs and asks
// IssuedHere from several goroutines while another rotates the root
// again and again (run with -race). Every signing succeeds; a leaf is
// signed by a root of the bundle published when it was signed (checked
// whenever no publication came between the reads around the signing);
// its issuer is ours; and once a rotation returns, the next leaf is
// signed by the root it activated.
//
// Some leaves are always checked against an unchanged bundle: each
// publication falls between the reads of at most one signing per
// goroutine, and there are fewer publications (New's, then about two per
// rotation) than signings per goroutine, so some signings see none.
func TestSigningWhileRotating(t *testing.T) {
	const (
		signers   = 4
		signings  = 25 // each, more than the publications
		rotations = 4
	)
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	id := spiffeid.RequireFromPath(tdExample, "/w")
	csr := workloadCSR(t, id)

	var checked atomic.Int64
	var wg sync.WaitGroup
	for range signers {
		wg.Go(func() {
			for range signings {
				before := a.Bundle()
				issued, err := a.Sign(csr, id, 0)
				after := a.Bundle()
				if !assert.NoError(t, err) {
					return
				}
				issuer := signerOf(t, issued)
				assert.True(t, inBundle(after.X509Authorities(), issuer), "the signing root is published")
				if before == after {
					checked.Add(1)
					assert.True(t, inBundle(before.X509Authorities(), issuer), "the signing root was published when it signed")
				}
				assert.True(t, a.IssuedHere(issuer))
				_, _, err = a.SignJWT(id, []string{"db"}, 0)
				assert.NoError(t, err)
			}
		})
	}
	for range rotations {
		require.NoError(t, a.Rotate())
		require.NoError(t, a.Reconcile())
		clk.Step(PublishLead*cfg.RefreshHint + time.Second)
		require.NoError(t, a.Reconcile())
		var active *x509.Certificate
		for _, r := range a.Roots() {
			if r.State == castate.StateActive {
				active = r.Cert
			}
		}
		require.NotNil(t, active)
		issued, err := a.Sign(csr, id, 0)
		require.NoError(t, err)
		assert.True(t, signerOf(t, issued).Equal(active), "the next leaf is signed by the root the rotation activated")
	}
	wg.Wait()
	assert.Positive(t, checked.Load(), "leaves checked against an unchanged bundle")
}

// signerOf is the certificate of issued's chain that signed its leaf.
func signerOf(t *testing.T, issued *Issued) *x509.Certificate {
	t.Helper()
	for _, c := range issued.Chain[1:] {
		if issued.Leaf.CheckSignatureFrom(c) == nil {
			return c
		}
	}
	t.Error("no certificate of the chain signed the leaf")
	return nil
}

func inBundle(roots []*x509.Certificate, c *x509.Certificate) bool {
	for _, r := range roots {
		if c != nil && r.Equal(c) {
			return true
		}
	}
	return false
}

// TestSigningRefusalsSayWhy: with no signing certificate published, the
// signer asks the manager why, and every signing path refuses with the
// reason the state and its surroundings give: the upstream's last answer
// at a first start, the leader yet to create the state on a follower.
func TestSigningRefusalsSayWhy(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	u.set("", errUpstreamDown)
	upstream, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)

	fcfg := testConfig(t, clk)
	fcfg.Backend, fcfg.DataDir = newMemBackend(), ""
	fcfg.Leader = castate.LeaderFunc(func() bool { return false })
	follower, err := New(fcfg)
	require.NoError(t, err)

	id := spiffeid.RequireFromPath(tdExample, "/w")
	key := testca.NewKey(t, testca.ECP256)
	for _, tc := range []struct {
		name string
		a    *Authority
		want string
	}{
		{"upstream unreachable at a first start", upstream, "ca: invalid signing material: no intermediate yet; the upstream's last answer failed: ca: upstream fake upstream: connection refused"},
		{"follower before the leader wrote state", follower, "ca: invalid signing material: no CA state in " + fcfg.Backend.Describe() + " yet; the leader creates it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.a.SignX509SVID(X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id})
			require.ErrorIs(t, err, ErrInvalidSigningMaterial)
			assert.EqualError(t, err, tc.want)
			// A serving certificate waits for the CA: handshakes fail with
			// the reason, and no signing is attempted meanwhile.
			sc, err := tc.a.ServingCert(id, time.Hour)
			require.NoError(t, err)
			assert.Nil(t, sc.Leaf())
			cert, err := sc.GetCertificate(nil)
			assert.Nil(t, cert)
			require.ErrorIs(t, err, ErrInvalidSigningMaterial)
			assert.EqualError(t, err, "ca: no serving certificate for "+id.String()+" yet: "+tc.want)
			_, err = tc.a.SignIntermediate(intermediateCSR(t, key, nil), 0)
			assert.EqualError(t, err, tc.want)
			assert.Equal(t, 1.0, testutil.ToFloat64(tc.a.metrics.signings.WithLabelValues("signing_material")),
				"the X509-SVID counts; the waiting serving certificate and SignIntermediate never did")
		})
	}
}
