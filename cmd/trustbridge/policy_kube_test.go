package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/audit"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// Until the ClusterTrustPolicy resources are read, SDS callers get the
// local trust domain only, even where the policy in force (here none:
// every trust domain) would give more; once read, the policy decides, and
// the streams waiting on the gate's channel are woken.
func TestCRDGateFailsClosedUntilSynced(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	partner := spiffeid.RequireTrustDomainFromString("partner.example")
	access := trustpolicy.NewAccess(trustpolicy.NewCell(nil), nil)
	t.Cleanup(access.Close)
	synced := make(chan struct{})
	gate, err := newCRDGate(access, synced, td)
	require.NoError(t, err)
	ident := authn.Identity{ID: spiffeid.RequireFromPath(td, "/ns/a/sa/b")}

	d, ch := gate.Decide(ident)
	_, ok := d.Allows(partner)
	assert.False(t, ok, "not synced: no federated trust domain")
	_, ok = d.Allows(td)
	assert.True(t, ok, "the local trust domain always")
	assert.Equal(t, (<-chan struct{})(synced), ch, "woken when the resources are read")

	close(synced)
	d, _ = gate.Decide(ident)
	_, ok = d.Allows(partner)
	assert.True(t, ok, "synced, no policy: every trust domain")
}

// The gate's watcher runs until the server stops, also once the resources
// were read: the server's parts run as a group that ends when any part
// returns, so returning at sync stopped the whole server a second after
// it started with --trust-policy-crd.
func TestCRDGateWatchRunsUntilStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		td := spiffeid.RequireTrustDomainFromString("example.org")
		access := trustpolicy.NewAccess(trustpolicy.NewCell(nil), nil)
		t.Cleanup(access.Close)
		synced := make(chan struct{})
		gate, err := newCRDGate(access, synced, td)
		require.NoError(t, err)
		var logs bytes.Buffer
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- gate.watch(ctx, time.Minute, slog.New(slog.NewTextHandler(&logs, nil))) }()

		time.Sleep(time.Minute) // the fake clock of the bubble: the warning is due
		synctest.Wait()
		assert.Contains(t, logs.String(), "ClusterTrustPolicy resources not read yet")
		close(synced)
		synctest.Wait()
		assert.Contains(t, logs.String(), "ClusterTrustPolicy resources read")
		select {
		case err := <-done:
			t.Fatalf("watch returned after the sync (%v): that stops the server", err)
		default:
		}
		cancel()
		synctest.Wait()
		select {
		case err := <-done:
			assert.NoError(t, err)
		default:
			t.Fatal("watch still running after the server stopped")
		}
	})
}

// The ClusterTrustPolicy set the server reads first, with no resources,
// leaves the policy as it was: it is no trust_policy_changed entry. A set
// that changes the policy is one, from source "crd".
func TestApplyCRDAuditsOnlyChanges(t *testing.T) {
	var buf bytes.Buffer
	trail, err := newAuditTrail(audit.New(&buf), "replica-1", nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	o := policyServer(t, nil)
	p, err := setupPolicy(o, spiffeid.RequireTrustDomainFromString("example.org"), nil, trail, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	p.recordStart()
	events := func() []audit.Entry {
		var out []audit.Entry
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var e audit.Entry
			require.NoError(t, json.Unmarshal([]byte(line), &e))
			out = append(out, e)
		}
		return out
	}
	require.Len(t, events(), 1, "the start")

	require.NoError(t, p.applyCRD(nil))
	assert.Len(t, events(), 1, "no resources: nothing changed")

	rule := trustpolicy.Rule{Name: "clustertrustpolicy/ops", Origin: "crd:ops",
		Workloads:    []trustpolicy.Selector{{SPIFFEID: "spiffe://example.org/ns/ops/*"}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "partner.example"}}}
	require.NoError(t, p.applyCRD([]trustpolicy.Rule{rule}))
	require.NoError(t, p.applyCRD([]trustpolicy.Rule{rule}))
	evs := events()
	require.Len(t, evs, 2, "one change, read twice")
	assert.Equal(t, eventPolicyChanged, evs[1].Event)
	require.NotNil(t, evs[1].Policy)
	assert.Equal(t, crdPolicySource, evs[1].Policy.Source)
	assert.Equal(t, []string{rule.Name}, evs[1].Policy.RulesAdded)
}
