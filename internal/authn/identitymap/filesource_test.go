package identitymap

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/fileutil/rulesource"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

const fileMap = `rules:
- name: host
  workloads: [{uid: 7}]
  spiffeID: spiffe://{{.TrustDomain}}/host/a
`

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
}

func hostID(t *testing.T, cell *Cell) string {
	t.Helper()
	id, err := cell.Load().Identify(Workload{Unix: true, UID: 7})
	require.NoError(t, err)
	return id.ID.String()
}

func TestFileSourceMissingAtStart(t *testing.T) {
	c, _, _ := newTestCombiner(t, "")
	path := filepath.Join(t.TempDir(), "ids.yaml")
	err := NewFileSource(path, c, nil, 0).Load()
	require.Error(t, err)
	assert.Contains(t, err.Error(), path+" does not exist: create it")
	assert.Equal(t, err.Error(), c.Statuses()[0].LastError)
}

func TestFileSourceReload(t *testing.T) {
	c, cell, _ := newTestCombiner(t, "")
	path := filepath.Join(t.TempDir(), "ids.yaml")
	writeFile(t, path, fileMap)
	logs := testlog.JSONLines(t)
	f := NewFileSource(path, c, slog.New(slog.NewJSONHandler(logs, nil)), 0)
	require.NoError(t, f.Load())
	good, ch := cell.Watch()
	assert.Equal(t, "file:"+path+":2", good.Rules()[0].Origin)
	assert.Equal(t, "spiffe://example.org/host/a", hostID(t, cell))
	errs := c.metrics.Reloads.WithLabelValues(f.Source(), rulesource.ResultError)

	require.NoError(t, f.Check())
	assert.False(t, isClosed(ch), "unchanged file: nothing published")

	// A bad edit keeps the last good map; the error is returned, in the
	// status, counted and logged once while it persists.
	writeFile(t, path, strings.Replace(fileMap, "uid: 7", "uid: '7'", 1))
	for range 2 {
		err := f.Check()
		require.Error(t, err)
		assert.Contains(t, err.Error(), `file:`+path+`:3: rule 1 "host": workloads[0].uid must be a decimal integer`)
	}
	assert.Same(t, good, cell.Load(), "the last good map stays")
	assert.False(t, isClosed(ch))
	assert.Equal(t, 1.0, testutil.ToFloat64(errs), "a persisting problem counts once")
	assert.Equal(t, 1, strings.Count(logs.String(), "identity map file refused; keeping the last good rules"), "and is logged once")
	assert.Contains(t, c.Statuses()[0].LastError, "workloads[0].uid")

	// One that parses but does not compile (another trust domain) is
	// refused by the Combiner, counted too.
	writeFile(t, path, strings.Replace(fileMap, "{{.TrustDomain}}", "other.example", 1))
	require.ErrorContains(t, f.Check(), `template names trust domain "other.example"`)
	assert.Equal(t, 2.0, testutil.ToFloat64(errs))
	assert.Same(t, good, cell.Load())

	require.NoError(t, os.Remove(path))
	require.ErrorContains(t, f.Check(), "does not exist")
	assert.Same(t, good, cell.Load(), "a removed file keeps the last good map too")

	// A good edit replaces it.
	writeFile(t, path, strings.Replace(fileMap, "host/a", "host/b", 1))
	require.NoError(t, f.Check())
	assert.True(t, isClosed(ch))
	assert.Equal(t, "spiffe://example.org/host/b", hostID(t, cell))
	assert.Empty(t, c.Statuses()[0].LastError)
}

func TestFileSourceLogsConflicts(t *testing.T) {
	c, _, _ := newTestCombiner(t, "")
	path := filepath.Join(t.TempDir(), "ids.yaml")
	writeFile(t, path, fileMap+strings.Replace(strings.Replace(strings.TrimPrefix(fileMap, "rules:\n"), "name: host", "name: host2", 1), "host/a", "host/b", 1))
	logs := testlog.JSONLines(t)
	require.NoError(t, NewFileSource(path, c, slog.New(slog.NewJSONHandler(logs, nil)), 0).Load())
	assert.Contains(t, logs.String(), `"msg":"identity map rules conflict: workloads they both select get no identity","policy_source":"file:`+path)
	assert.Contains(t, logs.String(), `"conflicts":1,"rule":"host"`)
}

// Run polls the file and publishes what it loads through the real
// combiner: an edit reaches Identify.
func TestFileSourceRun(t *testing.T) {
	c, cell, _ := newTestCombiner(t, "")
	path := filepath.Join(t.TempDir(), "ids.yaml")
	writeFile(t, path, fileMap)
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	f := NewFileSource(path, c, nil, time.Second, func(cfg *rulesource.FileConfig[Document]) { cfg.Clock = clk })
	require.NoError(t, f.Load())
	_, ch := cell.Watch()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.Run(ctx) }()
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond, "Run's ticker")
	writeFile(t, path, strings.Replace(fileMap, "host/a", "host/b", 1))
	clk.Step(time.Second)
	<-ch
	assert.Equal(t, "spiffe://example.org/host/b", hostID(t, cell))
	cancel()
	require.NoError(t, <-done)
}
