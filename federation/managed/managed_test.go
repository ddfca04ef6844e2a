package managed

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var local = spiffeid.RequireTrustDomainFromString("example.org")

func web(t testing.TB, td, u string) federation.Endpoint {
	t.Helper()
	pu, err := url.Parse(u)
	require.NoError(t, err)
	return federation.Endpoint{TrustDomain: spiffeid.RequireTrustDomainFromString(td), URL: pu, Profile: federation.ProfileHTTPSWeb}
}

func selfServing(t testing.TB, td string, b *spiffebundle.Bundle) federation.Endpoint {
	t.Helper()
	ep := web(t, td, "https://"+td+":8443/")
	ep.Profile = federation.ProfileHTTPSSPIFFE
	ep.EndpointSPIFFEID = spiffeid.RequireFromString("spiffe://" + td + "/trustbridge/bundle-endpoint")
	ep.BootstrapBundle = b
	return ep
}

// harness is a Manager whose Apply records what is in force.
type harness struct {
	m        *Manager
	dir      string
	mu       sync.Mutex
	applied  State
	changes  []Change
	applyErr error
	probeErr error
}

func newHarness(t *testing.T, dir string, reserved map[string]string) *harness {
	t.Helper()
	h := &harness{dir: dir}
	m, _, err := New(h.config(reserved))
	require.NoError(t, err)
	h.m = m
	return h
}

func (h *harness) config(reserved map[string]string) Config {
	return Config{
		Dir: h.dir, Local: local,
		Reserved: func(td spiffeid.TrustDomain) string { return reserved[td.Name()] },
		Apply: func(s State) error {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.applyErr != nil {
				return h.applyErr
			}
			h.applied = s
			return nil
		},
		Probe:    func(context.Context, federation.Endpoint) error { return h.probeErr },
		OnChange: func(c Change) { h.mu.Lock(); h.changes = append(h.changes, c); h.mu.Unlock() },
	}
}

func (h *harness) inForce() State {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.applied
}

func names(s State) (eps, bundles []string) {
	for _, ep := range s.Endpoints {
		eps = append(eps, ep.TrustDomain.Name())
	}
	for _, b := range s.Bundles {
		bundles = append(bundles, b.TrustDomain().Name())
	}
	return eps, bundles
}

func TestAddRemovePersist(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, nil)
	peer := testca.New(t, "peer.example")
	ctx := context.Background()

	require.NoError(t, h.m.Add(ctx, web(t, "web.example", "https://web.example/"), AddOptions{Actor: "op"}))
	require.NoError(t, h.m.Add(ctx, selfServing(t, "peer.example", peer.Bundle()), AddOptions{Actor: "op"}))
	eps, _ := names(h.inForce())
	assert.Equal(t, []string{"peer.example", "web.example"}, eps)

	info, err := os.Stat(filepath.Join(dir, EndpointsFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	// A restart loads and applies the same state, bootstrap bundle included.
	again := newHarness(t, dir, nil)
	got := again.inForce()
	require.Len(t, got.Endpoints, 2)
	assert.True(t, got.Endpoints[0].BootstrapBundle.Equal(peer.Bundle()))
	assert.Equal(t, h.m.State().Endpoints[1].String(), got.Endpoints[1].String())

	require.NoError(t, h.m.Remove(ctx, spiffeid.RequireTrustDomainFromString("web.example"), RemoveOptions{Actor: "op"}))
	require.NoError(t, h.m.Remove(ctx, spiffeid.RequireTrustDomainFromString("peer.example"), RemoveOptions{Actor: "op"}))
	assert.Empty(t, h.inForce().Endpoints)
	assert.NoFileExists(t, filepath.Join(dir, EndpointsFile))
	var kinds []string
	for _, c := range h.changes {
		kinds = append(kinds, c.Kind+" "+c.TrustDomain.Name()+" by "+c.Actor)
	}
	assert.Equal(t, []string{"federation_added web.example by op", "federation_added peer.example by op",
		"federation_removed web.example by op", "federation_removed peer.example by op"}, kinds)
}

func TestRefusals(t *testing.T) {
	h := newHarness(t, t.TempDir(), map[string]string{"flag.example": "--federate"})
	ctx := context.Background()
	require.NoError(t, h.m.Add(ctx, web(t, "web.example", "https://web.example/"), AddOptions{}))
	before := h.m.State()

	unanchored := selfServing(t, "peer.example", nil)
	tests := []struct {
		name string
		do   func() error
		err  error
		msg  string
	}{
		{"own trust domain", func() error { return h.m.Add(ctx, web(t, "example.org", "https://example.org/"), AddOptions{}) }, ErrInvalid, "this server's own trust domain"},
		{"configured by flag", func() error { return h.m.Add(ctx, web(t, "flag.example", "https://f/"), AddOptions{}) }, ErrReserved, "flag.example is configured by --federate; change it there"},
		{"remove configured by flag", func() error {
			return h.m.Remove(ctx, spiffeid.RequireTrustDomainFromString("flag.example"), RemoveOptions{})
		}, ErrReserved, "--federate"},
		{"exists", func() error { return h.m.Add(ctx, web(t, "web.example", "https://other/"), AddOptions{}) }, ErrExists, "replace it with --force"},
		{"first fetch unanchored", func() error { return h.m.Add(ctx, unanchored, AddOptions{}) }, federation.ErrNoBootstrapBundle, "trustDomainBundleFile"},
		{"remove unknown", func() error {
			return h.m.Remove(ctx, spiffeid.RequireTrustDomainFromString("nope.example"), RemoveOptions{})
		}, ErrNotFound, "federation list"},
		{"empty bundle", func() error {
			_, err := h.m.SetBundle(ctx, spiffebundle.New(spiffeid.RequireTrustDomainFromString("s.example")), "")
			return err
		}, ErrInvalid, "no X.509 or JWT authority"},
		{"bundle for own", func() error { _, err := h.m.SetBundle(ctx, testca.New(t, "example.org").Bundle(), ""); return err }, ErrInvalid, "own trust domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			require.ErrorIs(t, err, tt.err)
			assert.ErrorContains(t, err, tt.msg)
			assert.Equal(t, before, h.m.State(), "last good state kept")
			assert.Equal(t, before.Endpoints, h.inForce().Endpoints)
		})
	}
}

// A failing probe, apply or save changes nothing, in force or on disk.
func TestFailuresKeepLastGoodState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	h := newHarness(t, dir, nil)
	require.NoError(t, h.m.Add(ctx, web(t, "web.example", "https://web.example/"), AddOptions{}))
	onDisk, err := os.ReadFile(filepath.Join(dir, EndpointsFile))
	require.NoError(t, err)
	before := h.m.State()

	h.probeErr = errors.New("connection refused")
	err = h.m.Add(ctx, web(t, "down.example", "https://down.example/"), AddOptions{})
	require.ErrorIs(t, err, ErrFirstFetch)
	assert.ErrorContains(t, err, "connection refused; nothing was changed")
	// --no-fetch adds it anyway.
	require.NoError(t, h.m.Add(ctx, web(t, "down.example", "https://down.example/"), AddOptions{NoProbe: true}))
	require.NoError(t, h.m.Remove(ctx, spiffeid.RequireTrustDomainFromString("down.example"), RemoveOptions{}))
	h.probeErr = nil

	h.applyErr = errors.New("poller refused")
	require.ErrorContains(t, h.m.Add(ctx, web(t, "a.example", "https://a.example/"), AddOptions{}), "poller refused")
	h.applyErr = nil

	// Save fails: the data dir is gone (a file stands in its place).
	h.m.cfg.Dir = filepath.Join(dir, EndpointsFile)
	err = h.m.Add(ctx, web(t, "b.example", "https://b.example/"), AddOptions{})
	require.ErrorContains(t, err, "not saved in")
	h.m.cfg.Dir = dir

	assert.Equal(t, before, h.m.State())
	assert.Equal(t, before.Endpoints, h.inForce().Endpoints, "the previous state was applied again")
	after, err := os.ReadFile(filepath.Join(dir, EndpointsFile))
	require.NoError(t, err)
	assert.Equal(t, onDisk, after)
}

func TestSetBundle(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, t.TempDir(), nil)
	peer := testca.New(t, "peer.example")
	peer2 := testca.New(t, "peer.example")

	kind, err := h.m.SetBundle(ctx, peer.Bundle(), "op")
	require.NoError(t, err)
	assert.Equal(t, KindStaticSet, kind)
	_, bundles := names(h.inForce())
	assert.Equal(t, []string{"peer.example"}, bundles)

	// The static bundle becomes the bootstrap bundle of an endpoint added
	// later without one: bundle set, then federation add (SPIRE's order).
	require.NoError(t, h.m.Add(ctx, selfServing(t, "peer.example", nil), AddOptions{}))
	got := h.inForce()
	assert.Empty(t, got.Bundles)
	require.Len(t, got.Endpoints, 1)
	assert.True(t, got.Endpoints[0].BootstrapBundle.Equal(peer.Bundle()))

	// Set again: now the endpoint's bootstrap bundle.
	kind, err = h.m.SetBundle(ctx, peer2.Bundle(), "op")
	require.NoError(t, err)
	assert.Equal(t, KindBootstrap, kind)
	assert.True(t, h.inForce().Endpoints[0].BootstrapBundle.Equal(peer2.Bundle()))

	// Replaced with --force and no bundle: the old bootstrap bundle stays.
	require.NoError(t, h.m.Add(ctx, selfServing(t, "peer.example", nil), AddOptions{Force: true}))
	assert.True(t, h.inForce().Endpoints[0].BootstrapBundle.Equal(peer2.Bundle()))
	assert.Equal(t, KindReplaced, h.changes[len(h.changes)-1].Kind)
}

// Concurrent changes are serialized: none is lost, in force or on disk.
func TestConcurrentChangesSerialized(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, nil)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			td := fmt.Sprintf("p%02d.example", i)
			assert.NoError(t, h.m.Add(context.Background(), web(t, td, "https://"+td+"/"), AddOptions{}))
		}()
	}
	wg.Wait()
	assert.Len(t, h.inForce().Endpoints, 20)
	s, _, err := Load(dir)
	require.NoError(t, err)
	assert.Len(t, s.Endpoints, 20)
	assert.Len(t, h.changes, 20)
}

// A corrupt or conflicting file at start is an error naming it.
func TestLoadRefusesBadFiles(t *testing.T) {
	peer := testca.New(t, "peer.example")
	doc, err := MarshalEndpoints([]federation.Endpoint{web(t, "web.example", "https://web.example/")})
	require.NoError(t, err)
	tests := []struct {
		name, file, content string
		reserved            map[string]string
		want                string
	}{
		{"yaml", EndpointsFile, "federation: [", nil, EndpointsFile + ": federation: "},
		{"unknown key", EndpointsFile, "federation:\n  - trustDomian: x\n", nil, `unknown key "trustDomian"`},
		{"bundle map", BundlesFile, `{"trust_domains":{"a.example":{"keys":[{}]}}}`, nil, BundlesFile + ": "},
		{"now configured by flag", EndpointsFile, string(doc), map[string]string{"web.example": "--federate"}, "web.example is configured by --federate"},
		{"unanchored", EndpointsFile, string(mustMarshal(t, selfServing(t, "peer.example", nil))), nil, "no bundle to authenticate the first fetch"},
	}
	_ = peer
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, tt.file), []byte(tt.content), 0o600))
			h := &harness{dir: dir}
			_, _, err := New(h.config(tt.reserved))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), dir)
			assert.Empty(t, h.inForce().Endpoints, "nothing applied")
		})
	}
}

func mustMarshal(t *testing.T, eps ...federation.Endpoint) []byte {
	t.Helper()
	doc, err := MarshalEndpoints(eps)
	require.NoError(t, err)
	return doc
}

func TestMarshalRoundTrip(t *testing.T) {
	peer := testca.New(t, "peer.example")
	ep := selfServing(t, "peer.example", peer.Bundle())
	ep.Refresh = federation.Refresh{Min: time.Minute, Max: time.Hour}
	eps := []federation.Endpoint{ep, web(t, "web.example", "https://web.example/path")}
	doc := mustMarshal(t, eps...)
	cfg, err := federation.ParseConfig(doc, nil)
	require.NoError(t, err)
	require.Len(t, cfg.Endpoints, 2)
	for i := range eps {
		assert.Equal(t, eps[i].String(), cfg.Endpoints[i].String())
		assert.Equal(t, eps[i].Refresh, cfg.Endpoints[i].Refresh)
	}
	assert.True(t, cfg.Endpoints[0].BootstrapBundle.Equal(peer.Bundle()))
}

func FuzzParse(f *testing.F) {
	peer := testca.New(f, "peer.example")
	ep := selfServing(f, "peer.example", peer.Bundle())
	eps, err := MarshalEndpoints([]federation.Endpoint{ep})
	require.NoError(f, err)
	f.Add(eps, []byte(nil))
	f.Add([]byte(nil), []byte(`{"trust_domains":{}}`))
	f.Add([]byte("federation: []\n"), []byte(`{"trust_domains":{"peer.example":{"keys":[]}}}`))
	f.Add([]byte("federation: [{trustDomain: a}]"), []byte("{"))
	f.Fuzz(func(t *testing.T, endpoints, bundles []byte) {
		s, _, err := Parse(endpoints, bundles)
		if err != nil {
			return
		}
		// What parses saves and parses back the same.
		doc, err := MarshalEndpoints(s.Endpoints)
		require.NoError(t, err)
		again, _, err := Parse(doc, nil)
		require.NoError(t, err)
		require.Len(t, again.Endpoints, len(s.Endpoints))
		for i := range s.Endpoints {
			assert.Equal(t, s.Endpoints[i].String(), again.Endpoints[i].String())
		}
	})
}

// An add of a trust domain with a static bundle that stopped between the
// two files' writes leaves it in both: the start keeps the endpoint (the
// newer state, whose bootstrap bundle holds those roots) and says so.
func TestLoadAfterAnInterruptedAdd(t *testing.T) {
	peer := testca.New(t, "peer.example")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, EndpointsFile), mustMarshal(t, selfServing(t, "peer.example", peer.Bundle())), 0o600))
	m, err := bundledoc.MarshalMap([]*spiffebundle.Bundle{peer.Bundle()})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, BundlesFile), m, 0o600))

	s, warnings, err := Load(dir)
	require.NoError(t, err)
	eps, bundles := names(s)
	assert.Equal(t, []string{"peer.example"}, eps)
	assert.Empty(t, bundles)
	require.Len(t, warnings, 1)
	assert.Contains(t, warnings[0], "the endpoint is kept, the static bundle dropped")
}

// Reads (federation list, the snapshot's origins) do not wait for a
// change whose first-fetch probe hangs on a slow peer.
func TestReadsDoNotWaitForAProbe(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	require.NoError(t, h.m.Add(context.Background(), web(t, "web.example", "https://web.example/"), AddOptions{}))
	probing, release := make(chan struct{}), make(chan struct{})
	h.m.cfg.Probe = func(context.Context, federation.Endpoint) error {
		close(probing)
		<-release
		return nil
	}
	done := make(chan error, 1)
	go func() {
		done <- h.m.Add(context.Background(), web(t, "slow.example", "https://slow.example/"), AddOptions{})
	}()
	<-probing
	assert.True(t, h.m.Has(spiffeid.RequireTrustDomainFromString("web.example")))
	assert.False(t, h.m.Has(spiffeid.RequireTrustDomainFromString("slow.example")), "not in force before its probe ends")
	eps, _ := names(h.m.State())
	assert.Equal(t, []string{"web.example"}, eps)
	close(release)
	require.NoError(t, <-done)
	eps, _ = names(h.m.State())
	assert.Equal(t, []string{"slow.example", "web.example"}, eps)
}

// An operator's bundle that carries an authority the trust domain revoked
// (the poller holds the revoked set) is refused, and the state stays.
func TestSetBundleRefusesARevokedAuthority(t *testing.T) {
	ctx := context.Background()
	h := &harness{dir: t.TempDir()}
	peer, next := testca.New(t, "peer.example"), testca.New(t, "peer.example")
	seq := uint64(8)
	held := []federation.Revoked{{Revocation: bundledoc.RevokeX509(peer.Cert), Sequence: &seq, Since: time.Now().UTC()}}
	cfg := h.config(nil)
	cfg.Revoked = func(td spiffeid.TrustDomain) []federation.Revoked {
		if td.Name() == "peer.example" {
			return held
		}
		return nil
	}
	m, _, err := New(cfg)
	require.NoError(t, err)

	_, err = m.SetBundle(ctx, peer.Bundle(), "op")
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorIs(t, err, federation.ErrRevokedAuthority)
	assert.Contains(t, err.Error(), "listed since sequence 8")
	assert.Empty(t, h.inForce().Bundles, "nothing applied")

	kind, err := m.SetBundle(ctx, next.Bundle(), "op")
	require.NoError(t, err)
	assert.Equal(t, KindStaticSet, kind)
}
