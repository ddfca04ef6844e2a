package main

import (
	"cmp"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/trustview"
)

// snapshotter builds what /v1/snapshot, `trustbridge audit` and /ui show:
// every trust domain the server trusts, by which authorities, since when
// and from where.
type snapshotter struct {
	td        spiffeid.TrustDomain
	authority *ca.Authority
	fed       *federationSetup
	// actor names this replica; leader reports whether it leads (nil:
	// a single server, always).
	actor  string
	leader func() bool
	now    func() time.Time
}

func newSnapshotter(td spiffeid.TrustDomain, a *ca.Authority, fed *federationSetup, kube *kubeSetup, now func() time.Time) *snapshotter {
	s := &snapshotter{td: td, authority: a, fed: fed, now: now}
	if kube != nil {
		s.actor, s.leader = kube.elector.Identity(), kube.elector.IsLeader
	} else {
		s.actor, _ = os.Hostname()
	}
	return s
}

// isLeader is whether this replica writes trust changes.
func (s *snapshotter) isLeader() bool { return s.leader == nil || s.leader() }

func (s *snapshotter) Snapshot() trustview.Snapshot {
	snap := trustview.Snapshot{
		Time: s.now().UTC(), TrustDomain: s.td.Name(), Actor: s.actor, Leader: s.isLeader(),
	}
	store := s.fed.store.Snapshot()
	statuses := map[string]federation.Status{}
	if s.fed.poller != nil {
		for _, st := range s.fed.poller.Status() {
			statuses[st.TrustDomain] = st
		}
	}
	names := map[string]bool{s.td.Name(): true}
	for _, td := range store.TrustDomains() {
		names[td.Name()] = true
	}
	for n := range statuses {
		names[n] = true
	}
	for n := range names {
		td, err := spiffeid.TrustDomainFromString(n)
		if err != nil {
			continue
		}
		view := trustview.TrustDomain{Name: n, Local: td == s.td, Sources: s.fed.store.Sources(td), Authorities: []trustview.Authority{}}
		if view.Sources == nil {
			view.Sources = []string{}
		}
		b, _ := store.Bundle(td)
		if view.Local {
			seq := s.authority.Sequence()
			view.Sequence = &seq
			view.Authorities = s.localAuthorities(b)
		} else {
			view.Authorities = bundleAuthorities(b, nil)
			view.Sequence = federation.SequenceOf(b)
		}
		if st, ok := statuses[n]; ok {
			view.Federation = federationView(st, s.fed.origin(td))
			view.Sequence = st.Sequence
		}
		snap.TrustDomains = append(snap.TrustDomains, view)
	}
	slices.SortFunc(snap.TrustDomains, func(a, b trustview.TrustDomain) int {
		if a.Local != b.Local {
			if a.Local {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return snap
}

// localAuthorities are the CA's roots with their rotation state, then any
// other authority trusted for the local trust domain (a bundle file).
func (s *snapshotter) localAuthorities(b *spiffebundle.Bundle) []trustview.Authority {
	out := []trustview.Authority{}
	seen := map[string]bool{}
	for _, r := range s.authority.Roots() {
		a := trustview.X509Authority(r.Cert)
		a.State = string(r.State)
		for _, t := range []time.Time{r.RetiredAt, r.ActivatedAt, r.PreparedAt} {
			if !t.IsZero() {
				u := t.UTC()
				a.Since = &u
				break
			}
		}
		seen[a.SHA256] = true
		out = append(out, a)
	}
	return append(out, bundleAuthorities(b, seen)...)
}

// bundleAuthorities describes b's authorities, skipping those in skip.
func bundleAuthorities(b *spiffebundle.Bundle, skip map[string]bool) []trustview.Authority {
	out := []trustview.Authority{}
	if b == nil {
		return out
	}
	for _, c := range b.X509Authorities() {
		if a := trustview.X509Authority(c); !skip[a.SHA256] {
			out = append(out, a)
		}
	}
	for _, f := range federation.Fingerprints(b) {
		if f.Kind != federation.AuthorityX509 && !skip[f.SHA256] {
			out = append(out, trustview.Authority{Kind: string(f.Kind), SHA256: f.SHA256, KeyID: f.KeyID})
		}
	}
	return out
}

func federationView(st federation.Status, origin string) *trustview.Federation {
	return &trustview.Federation{
		EndpointURL: st.EndpointURL, Profile: string(st.Profile), EndpointSPIFFEID: st.EndpointSPIFFEID,
		Origin: origin, State: string(st.State),
		LastAttempt: st.LastAttempt, LastSuccess: st.LastSuccess, NextRefresh: st.NextRefresh,
		LastError: st.LastError, ConsecutiveFailures: st.ConsecutiveFailures,
		RefreshHintSeconds: st.RefreshHintSeconds, Refusals: st.Refusals,
	}
}

// serveSnapshot answers GET /v1/snapshot.
func serveSnapshot(s *snapshotter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		if !strings.Contains(r.URL.RawQuery, "compact") {
			enc.SetIndent("", "  ")
		}
		_ = enc.Encode(s.Snapshot())
	}
}
