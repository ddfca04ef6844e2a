package audit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// upstreamSnapshot is a local CA under an upstream at now: its active
// intermediate lives from now-age for life, the CA signs leaves of up to
// maxTTL (default 24h), and up is the upstream's health.
func upstreamSnapshot(now time.Time, age, life, maxTTL time.Duration, up *api.UpstreamStatus) api.Snapshot {
	nb, na := now.Add(-age), now.Add(life-age)
	return api.Snapshot{
		Time: now, TrustDomain: "region.example",
		CA: &api.CAStatus{WorkloadTTLSeconds: int64(24 * time.Hour / time.Second), MaxWorkloadTTLSeconds: int64(maxTTL / time.Second), Upstream: up},
		TrustDomains: []api.TrustDomain{{
			Name: "region.example", Local: true,
			Authorities: []api.Authority{{
				Kind: api.KindX509, SHA256: "ab12", State: "active", Upstream: "trustbridge upstream corp:15012",
				NotBefore: &nb, NotAfter: &na, IsCA: true,
			}},
		}},
	}
}

func codes(fs []api.Finding) map[string]api.Severity {
	out := map[string]api.Severity{}
	for _, f := range fs {
		out[f.Code] = f.Severity
	}
	return out
}

func TestUpstreamFindings(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	failing := func(lastOK time.Duration) *api.UpstreamStatus {
		return &api.UpstreamStatus{Name: "trustbridge upstream corp:15012", LastSuccess: ago(lastOK), LastError: "connection refused", Failures: 3}
	}
	// failingSince: the last success lastOK ago, failing for down.
	failingSince := func(lastOK, down time.Duration) *api.UpstreamStatus {
		st := failing(lastOK)
		st.FailingSince = ago(down)
		return st
	}
	day := 24 * time.Hour
	for name, tc := range map[string]struct {
		age, life, maxTTL time.Duration
		up                *api.UpstreamStatus
		want              map[string]api.Severity
	}{
		"healthy: 48h intermediate, 12h old, leaves up to 24h": {
			age: 12 * time.Hour, life: 2 * day, maxTTL: day, up: &api.UpstreamStatus{Name: "u", LastSuccess: ago(12 * time.Hour)},
			want: map[string]api.Severity{}},
		"leaves of 90 days under a 48h intermediate": {
			age: 12 * time.Hour, life: 2 * day, maxTTL: 90 * day,
			want: map[string]api.Severity{CodeIntermediateShort: api.SeverityWarning}},
		"under a day left: the default leaf is cut short": {
			age: 30 * time.Hour, life: 2 * day, maxTTL: day,
			want: map[string]api.Severity{CodeIntermediateShort: api.SeverityCritical}},
		"an old success without failures is no outage": {
			age: 20 * time.Hour, life: 2 * day, maxTTL: day / 2, up: &api.UpstreamStatus{Name: "u", LastSuccess: ago(20 * time.Hour)},
			want: map[string]api.Severity{}},
		"failing for 10h of a 48h life (under a quarter)": {
			age: 10 * time.Hour, life: 2 * day, maxTTL: day / 2, up: failing(10 * time.Hour),
			want: map[string]api.Severity{}},
		"failing for 13h of a 48h life (over a quarter)": {
			age: 13 * time.Hour, life: 2 * day, maxTTL: day / 2, up: failing(13 * time.Hour),
			want: map[string]api.Severity{CodeUpstreamUnreachable: api.SeverityWarning}},
		"renewal failing for an hour at half life: a blip, not half a life": {
			age: 25 * time.Hour, life: 2 * day, maxTTL: 12 * time.Hour, up: failingSince(25*time.Hour, time.Hour),
			want: map[string]api.Severity{}},
		"renewal failing for 13h since half life (over a quarter)": {
			age: 37 * time.Hour, life: 2 * day, maxTTL: 6 * time.Hour, up: failingSince(37*time.Hour, 13*time.Hour),
			want: map[string]api.Severity{CodeUpstreamUnreachable: api.SeverityWarning}},
		"failing for 25h of a 48h life (over half)": {
			age: 25 * time.Hour, life: 2 * day, maxTTL: 12 * time.Hour, up: failing(25 * time.Hour),
			want: map[string]api.Severity{CodeUpstreamUnreachable: api.SeverityCritical}},
	} {
		t.Run(name, func(t *testing.T) {
			fs := Findings(upstreamSnapshot(now, tc.age, tc.life, tc.maxTTL, tc.up))
			assert.Equal(t, tc.want, codes(fs))
			for _, f := range fs {
				assert.NotEmpty(t, f.Fix)
				assert.Equal(t, "ab12", f.Authority)
			}
		})
	}
}

// A 48h intermediate is not an anchor about to expire: the anchors'
// expiry findings leave it to the upstream findings.
func TestIntermediateIsNotJudgedAsARoot(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	fs := Findings(upstreamSnapshot(now, time.Hour, 48*time.Hour, 24*time.Hour, nil))
	assert.Empty(t, fs)
}

func TestUpstreamUnreachableFraction(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	lastOK := now.Add(-10 * time.Hour)
	s := upstreamSnapshot(now, 10*time.Hour, 48*time.Hour, 12*time.Hour, &api.UpstreamStatus{Name: "u", LastSuccess: &lastOK, Failures: 1, LastError: "refused"})
	assert.Empty(t, FindingsWith(s, Options{}), "10h of 48h is under the default quarter")
	assert.Equal(t, map[string]api.Severity{CodeUpstreamUnreachable: api.SeverityWarning},
		codes(FindingsWith(s, Options{UpstreamUnreachableFraction: 0.2})))
	for _, bad := range []float64{-0.1, 1, 1.5} {
		require.Error(t, CheckOptions(Options{UpstreamUnreachableFraction: bad}), "%v", bad)
	}
	require.NoError(t, CheckOptions(Options{UpstreamUnreachableFraction: 0.5}))
}

// No valid intermediate under a failing upstream is critical, whether
// none was ever signed (the local trust domain then has no authority at
// all) or the last one expired; a refusal says so and how to mend it.
func TestNoIntermediate(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	since := now.Add(-time.Minute)
	down := &api.UpstreamStatus{Name: "trustbridge upstream corp:15012", LastError: "connection refused", Failures: 4, FailingSince: &since}
	refused := &api.UpstreamStatus{Name: "trustbridge upstream corp:15012", LastError: "permission denied", Failures: 2, FailingSince: &since, Refused: true}
	first := func(up *api.UpstreamStatus) api.Snapshot {
		return api.Snapshot{Time: now, TrustDomain: "region.example",
			CA: &api.CAStatus{WorkloadTTLSeconds: 3600, MaxWorkloadTTLSeconds: 3600, Upstream: up}}
	}
	expired := upstreamSnapshot(now, 49*time.Hour, 48*time.Hour, time.Hour, down)

	fs := Findings(first(down))
	require.Len(t, fs, 1)
	assert.Equal(t, api.Finding{Severity: api.SeverityCritical, Code: CodeNoIntermediate, TrustDomain: "region.example",
		Message: "the CA of region.example has no valid intermediate and signs nothing: upstream trustbridge upstream corp:15012 has failed to sign one 4 times since 2026-11-28T11:59:00Z (last: connection refused)",
		Fix:     "bring the upstream up and check --upstream-address; the CA asks again with backoff (5s doubling to 5m) and turns ready without a restart"}, fs[0])

	fs = Findings(first(refused))
	require.Len(t, fs, 1)
	assert.Contains(t, fs[0].Message, "(last: permission denied); the upstream refused, which asking again does not mend")
	assert.Contains(t, fs[0].Fix, "--downstream-allow")

	assert.Equal(t, api.SeverityCritical, codes(Findings(expired))[CodeNoIntermediate], "the last intermediate expired")
	assert.Empty(t, Findings(first(&api.UpstreamStatus{Name: "u"})), "no failure yet: the first request runs")
	assert.NotContains(t, codes(Findings(upstreamSnapshot(now, time.Hour, 48*time.Hour, time.Hour, down))), CodeNoIntermediate,
		"a valid intermediate signs through the outage")
}
