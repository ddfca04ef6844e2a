package trustpolicy

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/fileutil/rulesource"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const filePolicy = `rules:
- name: pay
  workloads: [{spiffeID: spiffe://example.org/ns/pay/*}]
  trustDomains: [{name: partner.example}]
`

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
}

func TestFileSourceMissingAtStart(t *testing.T) {
	c, _, _, _ := newTestCombiner(t, DefaultAllow)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	err := NewFileSource(path, c, nil, 0).Load()
	require.Error(t, err)
	assert.Contains(t, err.Error(), path+" does not exist: create it (an empty file has no rules) or drop --trust-policy")
	assert.Equal(t, err.Error(), c.Statuses()[0].LastError)
}

func TestFileSourceReload(t *testing.T) {
	c, cell, _, _ := newTestCombiner(t, DefaultAllow)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, filePolicy)
	logs := testlog.JSONLines(t)
	f := NewFileSource(path, c, slog.New(slog.NewJSONHandler(logs, nil)), 0)
	require.NoError(t, f.Load())
	good, ch := cell.Load()
	require.NotNil(t, good)
	assert.Equal(t, "file:"+path+":2", good.Rules()[0].Origin)
	errors := c.metrics.Reloads.WithLabelValues(f.Source(), rulesource.ResultError)
	successes := c.metrics.Reloads.WithLabelValues(f.Source(), rulesource.ResultSuccess)

	require.NoError(t, f.Check())
	assert.False(t, isClosed(ch), "unchanged file: nothing published")
	assert.Equal(t, 1.0, testutil.ToFloat64(successes))

	writeFile(t, path, strings.Replace(filePolicy, "partner.example", "spiffe://partner.example", 1))
	for range 2 {
		err := f.Check()
		require.Error(t, err)
		assert.Contains(t, err.Error(), `file:`+path+`:4: rule 1 "pay": trustDomains[0].name`)
	}
	p, _ := cell.Load()
	assert.Same(t, good, p, "the last good policy stays")
	assert.False(t, isClosed(ch))
	assert.Equal(t, 1.0, testutil.ToFloat64(errors), "a persisting problem counts once")
	assert.Equal(t, 1, strings.Count(logs.String(), "trust policy file refused"), "and is logged once")
	assert.Contains(t, logs.String(), `"level":"WARN"`)
	assert.Contains(t, c.Statuses()[0].LastError, "trustDomains[0].name")

	// A file that parses but does not compile (a selector of another
	// trust domain) is refused by the Combiner, counted once too.
	writeFile(t, path, strings.Replace(filePolicy, "example.org", "partner.example", 1))
	require.Error(t, f.Check())
	assert.Equal(t, 2.0, testutil.ToFloat64(errors))

	require.NoError(t, os.Remove(path))
	require.ErrorContains(t, f.Check(), "does not exist")
	p, _ = cell.Load()
	assert.Same(t, good, p, "a removed file keeps the last good policy too")

	writeFile(t, path, strings.Replace(filePolicy, "ns/pay/*", "ns/payments/*", 1))
	require.NoError(t, f.Check())
	assert.True(t, isClosed(ch))
	p, _ = cell.Load()
	assert.Equal(t, "spiffe://example.org/ns/payments/*", p.Rules()[0].Workloads[0].SPIFFEID)
	assert.Empty(t, c.Statuses()[0].LastError)
}

// A file refused because its rule's name is taken by another source is
// tried again at the next check: once that rule is gone, the same bytes
// load. The refusal is reported (hook, log, metric) once while it
// persists.
func TestFileSourceRetriesCombinerRefusal(t *testing.T) {
	c, cell, _, _ := newTestCombiner(t, DefaultAllow)
	require.NoError(t, c.SetSource("crd", []Rule{rule("pay", "spiffe://example.org/ns/other/*", "other.example")}))
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, filePolicy)
	var refused []string
	f := NewFileSource(path, c, nil, 0, WithRefusedHook(func(_ string, err error) { refused = append(refused, err.Error()) }))
	require.ErrorContains(t, f.Load(), "have the same name")
	for range 2 {
		require.ErrorContains(t, f.Check(), "have the same name")
	}
	assert.Empty(t, refused, "Load's refusal is its caller's to report; the same one again is not new")
	errs := c.metrics.Reloads.WithLabelValues(f.Source(), rulesource.ResultError)
	assert.Equal(t, 1.0, testutil.ToFloat64(errs), "a persisting refusal counts once")

	c.RemoveSource("crd")
	require.NoError(t, f.Check(), "the clash is gone: the same bytes load")
	p, _ := cell.Load()
	require.NotNil(t, p)
	assert.Equal(t, "file:"+path+":2", p.Rules()[0].Origin)
	assert.Empty(t, c.Statuses()[0].LastError)

	// Refused again after a success: reported again.
	require.NoError(t, c.SetSource("crd", []Rule{rule("web", "spiffe://example.org/ns/web/*", "other.example")}))
	writeFile(t, path, strings.Replace(filePolicy, "name: pay", "name: web", 1))
	require.ErrorContains(t, f.Check(), "have the same name")
	require.ErrorContains(t, f.Check(), "have the same name")
	assert.Len(t, refused, 1)
}

// Run polls the file and publishes what it loads through the real
// combiner: a workload the new file's rule does not select stops
// trusting the trust domain the rule governs.
func TestFileSourceRun(t *testing.T) {
	c, cell, _, _ := newTestCombiner(t, DefaultAllow)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, "")
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	f := NewFileSource(path, c, nil, time.Second, func(cfg *rulesource.FileConfig[Document]) { cfg.Clock = clk })
	require.NoError(t, f.Load())
	_, ch := cell.Load()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.Run(ctx) }()
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond, "Run's ticker")
	writeFile(t, path, filePolicy)
	clk.Step(time.Second)
	<-ch
	p, _ := cell.Load()
	_, ok := p.Decide(Subject{ID: spiffeid.RequireFromString("spiffe://example.org/ns/web/sa/a")}).Allows(partnerTD)
	assert.False(t, ok)
	cancel()
	require.NoError(t, <-done)
}
