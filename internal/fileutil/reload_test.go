package fileutil

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counter is a file holding "n=<number>": a number of at least 0 is good.
type counter struct {
	path    string
	parses  int
	refused []string
	changed []error
}

func (c *counter) read() ([]byte, error) { return os.ReadFile(c.path) }

func (c *counter) parse(data []byte, _ int, _ bool) (int, error) {
	c.parses++
	v, ok := strings.CutPrefix(strings.TrimSpace(string(data)), "n=")
	if !ok {
		return 0, errors.New(`want "n=<number>"`)
	}
	n, err := strconv.Atoi(v)
	if err == nil && n < 0 {
		err = errors.New("negative")
	}
	return n, err
}

func (c *counter) config() ReloaderConfig[[]byte, int] {
	return ReloaderConfig[[]byte, int]{
		Read:     c.read,
		Digest:   sha256.Sum256,
		Parse:    c.parse,
		Wrap:     func(err error) error { return fmt.Errorf("counter %s: %w", c.path, err) },
		Refused:  func(err error) { c.refused = append(c.refused, err.Error()) },
		Changing: func(err error) { c.changed = append(c.changed, err) },
	}
}

func writeContent(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
}

func signalled(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func current(t *testing.T, r *Reloader[[]byte, int]) int {
	t.Helper()
	v, ok := r.Current()
	require.True(t, ok, "a value is in force")
	return v
}

func TestReloaderKeepsLastGood(t *testing.T) {
	c := &counter{path: filepath.Join(t.TempDir(), "n")}
	r := NewReloader(c.config())
	_, ok := r.Current()
	assert.False(t, ok, "nothing before Load")

	writeContent(t, c.path, "n=1")
	require.NoError(t, r.Load())
	assert.Equal(t, 1, current(t, r))
	assert.True(t, signalled(r.Changes()), "the first load is a change")

	require.NoError(t, r.Check())
	assert.False(t, signalled(r.Changes()), "unchanged")
	assert.Equal(t, 1, c.parses, "unchanged content is not parsed again")

	writeContent(t, c.path, "n=-1")
	for range 2 {
		err := r.Check()
		require.Error(t, err)
		assert.Equal(t, "counter "+c.path+": negative", err.Error())
		assert.Equal(t, err, r.LastError())
	}
	assert.Equal(t, 1, current(t, r), "the last good value stays")
	assert.False(t, signalled(r.Changes()))
	assert.Equal(t, []string{"counter " + c.path + ": negative"}, c.refused, "a persisting problem is reported once")
	assert.Equal(t, 3, c.parses, "refused content is parsed again without SkipRefused")

	require.NoError(t, os.Remove(c.path))
	require.ErrorIs(t, r.Check(), os.ErrNotExist)
	assert.Len(t, c.refused, 2, "another problem is reported")

	writeContent(t, c.path, "n=-1")
	require.Error(t, r.Check())
	assert.Len(t, c.refused, 3, "the first problem again, after another one, is reported again")

	writeContent(t, c.path, "n=1")
	require.NoError(t, r.Check(), "back to the content in force")
	assert.NoError(t, r.LastError())
	assert.False(t, signalled(r.Changes()))

	writeContent(t, c.path, "n=2")
	require.NoError(t, r.Check())
	assert.Equal(t, 2, current(t, r))
	assert.True(t, signalled(r.Changes()))
	assert.Empty(t, c.changed)
}

func TestReloaderLoadFailure(t *testing.T) {
	c := &counter{path: filepath.Join(t.TempDir(), "n")}
	r := NewReloader(c.config())
	writeContent(t, c.path, "nonsense")
	err := r.Load()
	require.Error(t, err)
	assert.Equal(t, err, r.LastError())
	_, ok := r.Current()
	assert.False(t, ok)
	assert.False(t, signalled(r.Changes()))

	require.Error(t, r.Check())
	assert.Empty(t, c.refused, "Load's failure is its caller's to report, and Check found the same")
}

// Kubernetes updates Secret and ConfigMap volumes by swapping the ..data
// symlink; the file's own path never changes.
func TestReloaderSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	for gen, content := range map[string]string{"..v1": "n=1", "..v2": "n=2"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, gen), 0o700))
		writeContent(t, filepath.Join(dir, gen, "n"), content)
	}
	require.NoError(t, os.Symlink("..v1", filepath.Join(dir, "..data")))
	require.NoError(t, os.Symlink(filepath.Join("..data", "n"), filepath.Join(dir, "n")))
	c := &counter{path: filepath.Join(dir, "n")}
	r := NewReloader(c.config())
	require.NoError(t, r.Load())
	assert.Equal(t, 1, current(t, r))
	require.True(t, signalled(r.Changes()))

	require.NoError(t, os.Symlink("..v2", filepath.Join(dir, "..data_tmp")))
	require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	require.NoError(t, r.Check())
	assert.Equal(t, 2, current(t, r))
	assert.True(t, signalled(r.Changes()))
}

func TestReloaderChanging(t *testing.T) {
	t.Run("Load reads again", func(t *testing.T) {
		c := &counter{path: filepath.Join(t.TempDir(), "n")}
		writeContent(t, c.path, "n=1")
		cfg := c.config()
		reads := 0
		cfg.Read = func() ([]byte, error) {
			if reads++; reads < 3 {
				return nil, ErrChanging
			}
			return c.read()
		}
		r := NewReloader(cfg)
		require.NoError(t, r.Load())
		assert.Equal(t, 3, reads)
		assert.Equal(t, 1, current(t, r))
	})
	t.Run("Load gives up", func(t *testing.T) {
		c := &counter{path: filepath.Join(t.TempDir(), "n")}
		cfg := c.config()
		cfg.LoadAttempts = 2
		reads := 0
		cfg.Read = func() ([]byte, error) { reads++; return nil, ErrChanging }
		r := NewReloader(cfg)
		err := r.Load()
		require.ErrorIs(t, err, ErrChanging)
		assert.Equal(t, "counter "+c.path+": files changed while being read", err.Error())
		assert.Equal(t, err, r.LastError())
		assert.Equal(t, 2, reads)
	})
	t.Run("Check leaves it for the next check", func(t *testing.T) {
		c := &counter{path: filepath.Join(t.TempDir(), "n")}
		writeContent(t, c.path, "n=1")
		cfg := c.config()
		changing := false
		cfg.Read = func() ([]byte, error) {
			if changing {
				return nil, ErrChanging
			}
			return c.read()
		}
		cfg.Parse = func(data []byte, cur int, have bool) (int, error) {
			n, err := c.parse(data, cur, have)
			if n == 3 {
				return 0, fmt.Errorf("%w: half written", ErrChanging)
			}
			return n, err
		}
		r := NewReloader(cfg)
		require.NoError(t, r.Load())
		require.True(t, signalled(r.Changes()))

		writeContent(t, c.path, "n=-1")
		require.Error(t, r.Check())
		changing = true
		require.NoError(t, r.Check(), "a writer at work is not an error")
		assert.Error(t, r.LastError(), "nor news: the last outcome stays")
		changing = false

		writeContent(t, c.path, "n=3")
		require.NoError(t, r.Check(), "Parse can tell a writer is at work too")
		assert.Equal(t, 1, current(t, r))
		assert.False(t, signalled(r.Changes()))
		assert.Len(t, c.changed, 2)
		assert.Len(t, c.refused, 1)
	})
}

func TestReloaderOptions(t *testing.T) {
	t.Run("Verify checks unchanged content again", func(t *testing.T) {
		c := &counter{path: filepath.Join(t.TempDir(), "n")}
		writeContent(t, c.path, "n=1")
		cfg := c.config()
		var limit int
		cfg.Verify = func(cur int) error {
			if cur > limit {
				return errors.New("over the limit")
			}
			return nil
		}
		r := NewReloader(cfg)
		limit = 1
		require.NoError(t, r.Load())
		limit = 0
		require.EqualError(t, r.Check(), "counter "+c.path+": over the limit")
		require.Error(t, r.Check())
		assert.Len(t, c.refused, 1)
		assert.Equal(t, 1, current(t, r), "nothing better to serve")
		limit = 1
		require.NoError(t, r.Check())
		assert.NoError(t, r.LastError())
		assert.Equal(t, 1, c.parses)
	})
	t.Run("SkipRefused parses refused content once", func(t *testing.T) {
		c := &counter{path: filepath.Join(t.TempDir(), "n")}
		writeContent(t, c.path, "n=1")
		cfg := c.config()
		cfg.SkipRefused = true
		r := NewReloader(cfg)
		require.NoError(t, r.Load())
		writeContent(t, c.path, "n=-1")
		first := r.Check()
		require.Error(t, first)
		assert.Equal(t, first, r.Check())
		assert.Equal(t, 2, c.parses)
		assert.Len(t, c.refused, 1)
	})
	t.Run("ReparseAfterFailure hands unchanged content over again", func(t *testing.T) {
		c := &counter{path: filepath.Join(t.TempDir(), "n")}
		writeContent(t, c.path, "n=1")
		cfg := c.config()
		cfg.ReparseAfterFailure = true
		r := NewReloader(cfg)
		require.NoError(t, r.Load())
		require.NoError(t, r.Check())
		assert.Equal(t, 1, c.parses)
		require.NoError(t, os.Remove(c.path))
		require.Error(t, r.Check())
		writeContent(t, c.path, "n=1")
		require.NoError(t, r.Check())
		assert.Equal(t, 2, c.parses)
	})
	t.Run("Same is not signalled", func(t *testing.T) {
		c := &counter{path: filepath.Join(t.TempDir(), "n")}
		writeContent(t, c.path, "n=1")
		cfg := c.config()
		cfg.Same = func(prev, next int) bool { return prev == next }
		r := NewReloader(cfg)
		require.NoError(t, r.Load())
		require.True(t, signalled(r.Changes()))
		writeContent(t, c.path, "n=01")
		require.NoError(t, r.Check())
		assert.False(t, signalled(r.Changes()), "reformatted, same value")
		writeContent(t, c.path, "n=1")
		require.NoError(t, r.Check())
		assert.Equal(t, 3, c.parses, "the digest in force followed the reformatted content")
	})
}

// TestReloaderRun drives Run on synctest's fake time: the poll is observed
// without sleeping, and the bubble fails the test if Run is still running
// once the context is cancelled.
func TestReloaderRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &counter{path: filepath.Join(t.TempDir(), "n")}
		writeContent(t, c.path, "n=1")
		r := NewReloader(c.config())
		require.NoError(t, r.Load())
		require.True(t, signalled(r.Changes()))

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx, nil, 10*time.Second) }()

		writeContent(t, c.path, "n=2")
		time.Sleep(9 * time.Second)
		synctest.Wait()
		assert.False(t, signalled(r.Changes()), "no check before the interval")

		time.Sleep(time.Second)
		synctest.Wait()
		assert.True(t, signalled(r.Changes()))
		assert.Equal(t, 2, current(t, r))

		writeContent(t, c.path, "nonsense")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assert.Error(t, r.LastError(), "failures are kept")
		assert.Equal(t, 2, current(t, r))

		cancel()
		assert.NoError(t, <-done, "failures never end Run")
	})
}
