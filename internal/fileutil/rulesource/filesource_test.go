package rulesource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// fakeDoc is a rules document of one rule name per line.
type fakeDoc struct{ rules []string }

// fakeCombiner records what a FileSource hands it, as a Combiner's
// Status would: the rules in force and the source's last error. It
// refuses a document with a rule named refuse, as a Combiner refuses a
// name another source uses.
type fakeCombiner struct {
	mu      sync.Mutex
	doc     *fakeDoc // in force; nil before the first
	lastErr string
	refuse  string
	loaded  chan struct{} // signalled on each load, if empty
}

func newFakeCombiner() *fakeCombiner { return &fakeCombiner{loaded: make(chan struct{}, 1)} }

func (c *fakeCombiner) SetSourceDocument(_ string, doc fakeDoc) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range doc.rules {
		if r == c.refuse {
			c.lastErr = fmt.Sprintf("rule %q: two sources have the same name", r)
			return errors.New(c.lastErr)
		}
	}
	c.doc, c.lastErr = &doc, ""
	select {
	case c.loaded <- struct{}{}:
	default:
	}
	return nil
}

func (c *fakeCombiner) SetSourceError(_ string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr = err.Error()
}

// state is the rules in force (nil for none yet) and the last error.
func (c *fakeCombiner) state() ([]string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.doc == nil {
		return nil, c.lastErr
	}
	return c.doc.rules, c.lastErr
}

func (c *fakeCombiner) setRefuse(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refuse = name
}

// parseFake parses one rule name per line; a line "bad" is refused. It
// counts its calls in *parses.
func parseFake(parses *int) func([]byte, string) (fakeDoc, error) {
	return func(data []byte, source string) (fakeDoc, error) {
		*parses++
		var d fakeDoc
		for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			switch line {
			case "":
			case "bad":
				return fakeDoc{}, fmt.Errorf("%s:%d: bad rule", source, i+1)
			default:
				d.rules = append(d.rules, line)
			}
		}
		return d, nil
	}
}

func newTestSource(t *testing.T, path string, c *fakeCombiner, mod func(*FileConfig[fakeDoc])) *FileSource[fakeDoc] {
	t.Helper()
	var parses int
	cfg := FileConfig[fakeDoc]{
		Path:        path,
		Combiner:    c,
		Parse:       parseFake(&parses),
		Rules:       func(d fakeDoc) int { return len(d.rules) },
		MaxSize:     1 << 10,
		ErrorPrefix: "test: rules file",
		MissingHint: " or drop --rules",
		LogName:     "test rules file",
	}
	if mod != nil {
		mod(&cfg)
	}
	return NewFileSource(cfg)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
}

func TestFileSourceMissingAtStart(t *testing.T) {
	for _, tc := range []struct{ hint, want string }{
		{" or drop --rules", " does not exist: create it (an empty file has no rules) or drop --rules"},
		{"", " does not exist: create it (an empty file has no rules)"},
	} {
		t.Run(tc.hint, func(t *testing.T) {
			c := newFakeCombiner()
			path := filepath.Join(t.TempDir(), "rules.yaml")
			f := newTestSource(t, path, c, func(cfg *FileConfig[fakeDoc]) { cfg.MissingHint = tc.hint })
			assert.Equal(t, "file:"+path, f.Source())
			err := f.Load()
			require.Error(t, err)
			assert.Equal(t, "test: rules file "+path+tc.want, err.Error())
			_, lastErr := c.state()
			assert.Equal(t, err.Error(), lastErr)
		})
	}
}

// The settings: the log's wording, the Loaded and Refused hooks.
func TestFileSourceLogsAndHooks(t *testing.T) {
	c := newFakeCombiner()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "a\nb\n")
	logs := testlog.JSONLines(t)
	var loaded [][]string
	var refused []string
	f := newTestSource(t, path, c, func(cfg *FileConfig[fakeDoc]) {
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		cfg.Loaded = func(l *slog.Logger, d fakeDoc) {
			loaded = append(loaded, d.rules)
			l.Warn("loaded hook")
		}
		cfg.Refused = func(source string, err error) { refused = append(refused, source+": "+err.Error()) }
	})
	require.NoError(t, f.Load())
	assert.Equal(t, [][]string{{"a", "b"}}, loaded)
	assert.Contains(t, logs.String(), `"msg":"test rules file loaded","policy_source":"file:`+path+`","policy_rules":2`)
	assert.Contains(t, logs.String(), `"msg":"loaded hook","policy_source":"file:`+path+`"`)

	writeFile(t, path, "a\nbad\n")
	for range 2 {
		require.ErrorContains(t, f.Check(), "file:"+path+":2: bad rule")
	}
	assert.Equal(t, []string{"file:" + path + ": file:" + path + ":2: bad rule"}, refused, "reported once while it persists")
	assert.Equal(t, 1, strings.Count(logs.String(), "test rules file refused; keeping the last good rules"), "and logged once")
	assert.Len(t, loaded, 1, "a refused file is not loaded")
}

// A file refused by the Combiner is tried again at the next check: once
// the clash is gone, the same bytes load.
func TestFileSourceRetriesCombinerRefusal(t *testing.T) {
	c := newFakeCombiner()
	c.setRefuse("a")
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "a\n")
	var refused int
	f := newTestSource(t, path, c, func(cfg *FileConfig[fakeDoc]) { cfg.Refused = func(string, error) { refused++ } })
	require.ErrorContains(t, f.Load(), "have the same name")
	require.ErrorContains(t, f.Check(), "have the same name")
	assert.Zero(t, refused, "Load's refusal is its caller's to report; the same one again is not new")

	c.setRefuse("")
	require.NoError(t, f.Check(), "the clash is gone: the same bytes load")
	rules, lastErr := c.state()
	assert.Equal(t, []string{"a"}, rules)
	assert.Empty(t, lastErr)
}

// Kubernetes updates ConfigMap volumes by swapping the ..data symlink.
func TestFileSourceSymlinkSwap(t *testing.T) {
	c := newFakeCombiner()
	dir := t.TempDir()
	for name, content := range map[string]string{"v1": "pay\n", "v2": "web\n"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, name), 0o700))
		writeFile(t, filepath.Join(dir, name, "rules.yaml"), content)
	}
	require.NoError(t, os.Symlink("v1", filepath.Join(dir, "..data")))
	require.NoError(t, os.Symlink("..data/rules.yaml", filepath.Join(dir, "rules.yaml")))
	f := newTestSource(t, filepath.Join(dir, "rules.yaml"), c, nil)
	require.NoError(t, f.Load())
	rules, _ := c.state()
	assert.Equal(t, []string{"pay"}, rules)

	require.NoError(t, os.Symlink("v2", filepath.Join(dir, "..data_tmp")))
	require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	require.NoError(t, f.Check())
	rules, _ = c.state()
	assert.Equal(t, []string{"web"}, rules)
}

func TestFileSourceRun(t *testing.T) {
	c := newFakeCombiner()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "")
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	f := newTestSource(t, path, c, func(cfg *FileConfig[fakeDoc]) {
		cfg.Interval = time.Second
		cfg.Clock = clk
	})
	require.NoError(t, f.Load())
	<-c.loaded

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.Run(ctx) }()
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond, "Run's ticker")
	writeFile(t, path, "pay\n")
	clk.Step(time.Second)
	<-c.loaded
	rules, _ := c.state()
	assert.Equal(t, []string{"pay"}, rules)
	cancel()
	require.NoError(t, <-done)
}

// Deleting the file and writing an empty one in its place loads the
// empty file (no rules): a read error is not remembered as the error of
// the bytes read (none).
func TestFileSourceEmptyAfterMissing(t *testing.T) {
	c := newFakeCombiner()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "pay\n")
	f := newTestSource(t, path, c, nil)
	require.NoError(t, f.Load())

	require.NoError(t, os.Remove(path))
	require.ErrorContains(t, f.Check(), "does not exist")
	rules, _ := c.state()
	assert.Equal(t, []string{"pay"}, rules, "a missing file keeps the last good rules")

	writeFile(t, path, "")
	require.NoError(t, f.Check())
	rules, lastErr := c.state()
	assert.Empty(t, rules, "the empty file is in force: no rules")
	assert.Empty(t, lastErr)
}

// The same bytes Parse refused are not parsed again, but are refused
// again with the same error.
func TestFileSourceParseErrorCached(t *testing.T) {
	c := newFakeCombiner()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "bad\n")
	var parses int
	f := newTestSource(t, path, c, func(cfg *FileConfig[fakeDoc]) { cfg.Parse = parseFake(&parses) })
	first := f.Load()
	require.Error(t, first)
	assert.Equal(t, first.Error(), f.Check().Error())
	assert.NotEmpty(t, f.parseErr)
	assert.Equal(t, 1, parses)
}

// Bad bytes, then the file gone, then the same bad bytes again: the
// status shows the parse error again, not the missing file, and the
// refusal is reported again (another failure came in between).
func TestFileSourceCachedParseErrorStillRecorded(t *testing.T) {
	c := newFakeCombiner()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "pay\n")
	var refused []string
	f := newTestSource(t, path, c, func(cfg *FileConfig[fakeDoc]) {
		cfg.Refused = func(_ string, err error) { refused = append(refused, err.Error()) }
	})
	require.NoError(t, f.Load())

	writeFile(t, path, "bad\n")
	parseErr := f.Check()
	require.Error(t, parseErr)
	require.NoError(t, os.Remove(path))
	require.ErrorContains(t, f.Check(), "does not exist")
	writeFile(t, path, "bad\n")
	assert.Equal(t, parseErr.Error(), f.Check().Error())
	_, lastErr := c.state()
	assert.Equal(t, parseErr.Error(), lastErr)
	assert.Len(t, refused, 3)
}

func TestFileSourceTooLarge(t *testing.T) {
	c := newFakeCombiner()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, strings.Repeat("a", 2<<10))
	err := newTestSource(t, path, c, nil).Load()
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "test: rules file "+path+": "), err.Error())
}
