package trustpolicy

import (
	"fmt"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// fakeLabels is a LabelSource whose labels the test sets.
type fakeLabels struct {
	mu      sync.Mutex
	labels  map[string]map[string]string // "<ns>/<sa>"
	changed chan struct{}
}

func newFakeLabels() *fakeLabels {
	return &fakeLabels{labels: make(map[string]map[string]string), changed: make(chan struct{})}
}

func (f *fakeLabels) Labels(ns, name string) map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.labels[ns+"/"+name]
}

func (f *fakeLabels) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *fakeLabels) set(ref string, l map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.labels[ref] = l
	close(f.changed)
	f.changed = make(chan struct{})
}

func saIdentity(ns, sa string) authn.Identity {
	return authn.Identity{
		ID:     spiffeid.RequireFromString(fmt.Sprintf("spiffe://example.org/ns/%s/sa/%s", ns, sa)),
		Method: authn.MethodKubernetesJWT,
		Grant:  &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: ns + "/" + sa},
	}
}

func x509Identity(id string) authn.Identity {
	return authn.Identity{ID: spiffeid.RequireFromString(id), Method: authn.MethodX509SVID}
}

func TestSubjectOf(t *testing.T) {
	tests := []struct {
		name  string
		ident authn.Identity
		want  Subject
	}{
		{"service account token", saIdentity("pay", "api"), Subject{Namespace: "pay", ServiceAccount: "api"}},
		{"x509 with a service account grant", authn.Identity{Method: authn.MethodX509SVID, Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "pay/api"}}, Subject{Namespace: "pay", ServiceAccount: "api"}},
		{"x509 with a bootstrap grant", authn.Identity{Method: authn.MethodX509SVID, Grant: &authn.Grant{Method: authn.MethodBootstrapToken, Ref: "pay/api"}}, Subject{}},
		{"x509 without a grant", authn.Identity{Method: authn.MethodX509SVID}, Subject{}},
		{"malformed ref", authn.Identity{Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "pay"}}, Subject{}},
		{"pod namespace only", authn.Identity{Pod: authn.PodRef{Namespace: "pay", Name: "p"}}, Subject{Namespace: "pay"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SubjectOf(tt.ident)
			tt.want.ID = tt.ident.ID
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestDecide(t *testing.T) {
	grant := func(td string, peers ...string) TrustDomainGrant {
		return TrustDomainGrant{TrustDomain: td, Peers: peers}
	}
	rules := []Rule{
		{Name: "pay-partner", Workloads: []Selector{{SPIFFEID: "spiffe://example.org/ns/pay/*"}},
			TrustDomains: []TrustDomainGrant{grant("partner.example", "spiffe://partner.example/ns/billing/sa/api")}},
		{Name: "pay-api-ops", Workloads: []Selector{{SPIFFEID: "spiffe://example.org/ns/pay/sa/api"}},
			TrustDomains: []TrustDomainGrant{grant("partner.example", "spiffe://partner.example/ns/ops/*")}},
		{Name: "ops-all", Workloads: []Selector{{Namespace: "ops"}},
			TrustDomains: []TrustDomainGrant{grant("partner.example")}},
		{Name: "tier-api", Workloads: []Selector{{Namespace: "web", Labels: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}}},
			TrustDomains: []TrustDomainGrant{grant("other.example")}},
	}
	tests := []struct {
		name    string
		def     Default
		ident   authn.Identity
		labels  map[string]string
		td      spiffeid.TrustDomain
		ok      bool
		peers   []string
		matched []string
	}{
		{"local always", DefaultDeny, x509Identity("spiffe://example.org/x"), nil, localTD, true, nil, nil},
		{"governed, not selected", DefaultAllow, x509Identity("spiffe://example.org/ns/web/sa/x"), nil, partnerTD, false, nil, nil},
		{"governed, prefix edge", DefaultAllow, x509Identity("spiffe://example.org/ns/payments/sa/x"), nil, partnerTD, false, nil, nil},
		{"governed, selected", DefaultAllow, x509Identity("spiffe://example.org/ns/pay/sa/web"), nil, partnerTD, true, []string{"spiffe://partner.example/ns/billing/sa/api"}, []string{"pay-partner"}},
		{"peers merge", DefaultAllow, x509Identity("spiffe://example.org/ns/pay/sa/api"), nil, partnerTD, true,
			[]string{"spiffe://partner.example/ns/billing/sa/api", "spiffe://partner.example/ns/ops/*"}, []string{"pay-partner", "pay-api-ops"}},
		{"ungoverned, default allow", DefaultAllow, x509Identity("spiffe://example.org/ns/web/sa/x"), nil, spiffeid.RequireTrustDomainFromString("third.example"), true, nil, nil},
		{"ungoverned, default deny", DefaultDeny, x509Identity("spiffe://example.org/ns/web/sa/x"), nil, spiffeid.RequireTrustDomainFromString("third.example"), false, nil, nil},
		{"namespace needs a service account", DefaultAllow, x509Identity("spiffe://example.org/ns/ops/sa/x"), nil, partnerTD, false, nil, nil},
		{"namespace by service account; unrestricted", DefaultAllow, saIdentity("ops", "x"), nil, partnerTD, true, nil, []string{"ops-all"}},
		{"labels match", DefaultAllow, saIdentity("web", "x"), map[string]string{"tier": "api"}, otherTD, true, nil, []string{"tier-api"}},
		{"labels differ", DefaultAllow, saIdentity("web", "x"), map[string]string{"tier": "db"}, otherTD, false, nil, nil},
		{"labels unknown", DefaultAllow, saIdentity("web", "x"), nil, otherTD, false, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(localTD, tt.def, rules)
			require.NoError(t, err)
			labels := newFakeLabels()
			if tt.labels != nil {
				labels.set("web/x", tt.labels)
			}
			a := NewAccess(NewCell(p), labels)
			defer a.Close()
			d, _ := a.Decide(tt.ident)
			g, ok := d.Allows(tt.td)
			assert.Equal(t, tt.ok, ok)
			var peers, matched []string
			for _, pt := range g.Peers {
				peers = append(peers, pt.String())
			}
			for _, m := range d.Matched {
				matched = append(matched, m.Rule)
			}
			assert.Equal(t, tt.peers, peers)
			assert.Equal(t, tt.matched, matched)
		})
	}
}

func TestDecideNoPolicy(t *testing.T) {
	a := NewAccess(NewCell(nil), nil)
	d, ch := a.Decide(x509Identity("spiffe://example.org/a"))
	assert.Equal(t, "", d.Key())
	_, ok := d.Allows(partnerTD)
	assert.True(t, ok, "no policy: everything trusted")
	assert.NotNil(t, ch)
}

func TestAccessChannel(t *testing.T) {
	labelRule := Rule{Name: "tier", Workloads: []Selector{{Labels: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}}},
		TrustDomains: []TrustDomainGrant{{TrustDomain: "partner.example"}}}
	c, cell, _, _ := newTestCombiner(t, DefaultAllow)
	labels := newFakeLabels()
	a := NewAccess(cell, labels)
	ident := saIdentity("web", "x")

	require.NoError(t, c.SetSource("crd", []Rule{rule("pay", "spiffe://example.org/ns/pay/*", "partner.example")}))
	_, ch := a.Decide(ident)
	labels.set("web/x", map[string]string{"tier": "api"})
	assert.False(t, isClosed(ch), "a policy without label selectors does not wait on labels")
	require.NoError(t, c.SetSource("crd", []Rule{labelRule}))
	<-ch

	d, ch := a.Decide(ident)
	_, ok := d.Allows(partnerTD)
	assert.True(t, ok)
	_, ch2 := a.Decide(ident)
	assert.Equal(t, ch, ch2, "one merged channel per change, whoever asks")
	labels.set("web/x", map[string]string{"tier": "db"})
	<-ch
	d, ch = a.Decide(ident)
	_, ok = d.Allows(partnerTD)
	assert.False(t, ok)

	require.NoError(t, c.SetSource("crd", nil))
	<-ch // the last watcher ends too: goleak checks at the end of the package

	require.NoError(t, c.SetSource("crd", []Rule{labelRule}))
	_, ch = a.Decide(ident)
	a.Close()
	<-ch
	_, ch = a.Decide(ident)
	policyCh := func() <-chan struct{} { _, ch := cell.Load(); return ch }()
	assert.Equal(t, policyCh, ch, "closed: policy changes only, no new goroutine")
}

func TestRecorderBounded(t *testing.T) {
	p, err := Compile(localTD, DefaultAllow, []Rule{rule("all", "spiffe://example.org/*", "partner.example")})
	require.NoError(t, err)
	cell := NewCell(p)
	a := NewAccess(cell, nil)
	assert.Equal(t, MatchedWorkloads{Recent: []string{}}, a.Matched("all"))
	for i := range 30 {
		a.Decide(x509Identity(fmt.Sprintf("spiffe://example.org/w%d", i)))
	}
	a.Decide(x509Identity("spiffe://example.org/w3"))
	m := a.Matched("all")
	assert.Equal(t, 30, m.Count)
	require.Len(t, m.Recent, MaxRecentWorkloads)
	assert.Equal(t, "spiffe://example.org/w3", m.Recent[0], "newest first, no duplicates")
	assert.Equal(t, "spiffe://example.org/w29", m.Recent[1])

	a.rec.counted = MaxCountedWorkloads - 1
	a.Decide(x509Identity("spiffe://example.org/new1"))
	a.Decide(x509Identity("spiffe://example.org/new2"))
	m = a.Matched("all")
	assert.Equal(t, 31, m.Count)
	assert.True(t, m.CountCapped)

	p2, err := Compile(localTD, DefaultAllow, []Rule{rule("other", "spiffe://example.org/*", "partner.example")})
	require.NoError(t, err)
	cell.Set(p2)
	a.Decide(x509Identity("spiffe://example.org/w1"))
	assert.Equal(t, 0, a.Matched("all").Count, "a removed rule's record is freed")
	assert.Equal(t, MaxCountedWorkloads-31+1, a.rec.counted, "the removed rule's 31 freed, w1 counted for the new one")
}

// TestAccessConcurrent is for -race: streams decide while the policy and
// the labels change.
func TestAccessConcurrent(t *testing.T) {
	c, cell, _, _ := newTestCombiner(t, DefaultAllow)
	labels := newFakeLabels()
	a := NewAccess(cell, labels)
	defer a.Close()
	labelRule := Rule{Name: "tier", Workloads: []Selector{{Labels: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}}},
		TrustDomains: []TrustDomainGrant{{TrustDomain: "partner.example"}}}
	require.NoError(t, c.SetSource("crd", []Rule{labelRule}))
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 200 {
				_, _ = a.Decide(saIdentity("web", fmt.Sprintf("sa%d", (i+j)%5)))
				_ = a.Matched("tier")
			}
		})
	}
	for j := range 50 {
		labels.set(fmt.Sprintf("web/sa%d", j%5), map[string]string{"tier": "api"})
		require.NoError(t, c.SetSource("crd", []Rule{labelRule, rule(fmt.Sprintf("r%d", j), "spiffe://example.org/*", "other.example")}))
	}
	wg.Wait()
	d, _ := a.Decide(saIdentity("web", "sa0"))
	_, ok := d.Allows(partnerTD)
	assert.True(t, ok)
	assert.Positive(t, a.Matched("tier").Count)
}
