package bundleserver_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func writeBundle(t testing.TB, path string, b *spiffebundle.Bundle) {
	t.Helper()
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, doc, 0o644))
}

func signalled(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bundle.json")
	v1 := newBundle(t, td, 1, 1, time.Minute)
	writeBundle(t, path, v1)
	var logs testlog.Buffer
	fs := bundleserver.NewFileSource(path, td, slog.New(slog.NewTextHandler(&logs, nil)))
	assert.Nil(t, fs.Bundle(), "nothing before Load")

	require.NoError(t, fs.Load())
	require.True(t, v1.Equal(fs.Bundle()))
	assert.True(t, signalled(fs.Changes()))

	// Unchanged: same pointer, no signal.
	first := fs.Bundle()
	require.NoError(t, fs.Check())
	assert.Same(t, first, fs.Bundle())
	assert.False(t, signalled(fs.Changes()))

	// Reformatted but equal: nothing for the server to re-render.
	doc, err := bundledoc.Marshal(v1)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append([]byte("  "), doc...), 0o644))
	require.NoError(t, fs.Check())
	assert.Same(t, first, fs.Bundle())
	assert.False(t, signalled(fs.Changes()))

	// A real change.
	v2 := withRoot(t, v1)
	writeBundle(t, path, v2)
	require.NoError(t, fs.Check())
	assert.True(t, v2.Equal(fs.Bundle()))
	assert.True(t, signalled(fs.Changes()))
	assert.NoError(t, fs.LastError())

	// Bad changes keep the last good bundle, are reported, and are logged
	// once however often they are checked.
	for _, bad := range []struct{ name, content string }{
		{"truncated", string(doc[:len(doc)/2])},
		{"not json", "hello"},
		{"no keys member", "{}"},
		{"too large", `{"keys":[]}` + strings.Repeat(" ", bundleserver.MaxFileSize)},
	} {
		t.Run(bad.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, []byte(bad.content), 0o644))
			before := strings.Count(logs.String(), "bundle file refused")
			for range 3 {
				err := fs.Check()
				require.Error(t, err)
				assert.Contains(t, err.Error(), "bundleserver: bundle file "+path)
			}
			assert.True(t, v2.Equal(fs.Bundle()), "last good bundle kept")
			assert.Error(t, fs.LastError())
			assert.False(t, signalled(fs.Changes()))
			assert.Equal(t, before+1, strings.Count(logs.String(), "bundle file refused"), "logged once")
		})
	}

	// Good again: the error clears.
	writeBundle(t, path, v2)
	require.NoError(t, fs.Check())
	assert.NoError(t, fs.LastError())

	// A missing file is an error too, and keeps the bundle.
	require.NoError(t, os.Remove(path))
	assert.Error(t, fs.Check())
	assert.True(t, v2.Equal(fs.Bundle()))
}

func TestFileSourceLoadFailures(t *testing.T) {
	dir := t.TempDir()
	missing := bundleserver.NewFileSource(filepath.Join(dir, "missing.json"), td, nil)
	assert.Error(t, missing.Load())
	assert.Error(t, missing.LastError())
	assert.Nil(t, missing.Bundle())

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"keys":[{"kty":"EC","use":"x509-svid"}]`), 0o644))
	fs := bundleserver.NewFileSource(bad, td, nil)
	err := fs.Load()
	require.Error(t, err)
	assert.Contains(t, err.Error(), bad)
	assert.Nil(t, fs.Bundle())
}

func TestFileSourceLogsWarnings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bundle.json")
	doc, err := bundledoc.Marshal(newBundle(t, td, 1, 1, 0))
	require.NoError(t, err)
	// An element of an unknown kty is ignored with a warning.
	doc = bytes.Replace(doc, []byte(`{"keys":[`), []byte(`{"keys":[{"kty":"AKP","use":"jwt-svid","kid":"pq"},`), 1)
	require.NoError(t, os.WriteFile(path, doc, 0o644))
	var logs testlog.Buffer
	fs := bundleserver.NewFileSource(path, td, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, fs.Load())
	assert.Len(t, fs.Bundle().X509Authorities(), 1)
	assert.Contains(t, logs.String(), `kty \"AKP\" is not supported`)
}

// TestFileSourceSymlinkSwap updates the file the way Kubernetes updates a
// Secret volume: a new timestamped directory, then an atomic rename of
// the "..data" symlink the file links through.
func TestFileSourceSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	v1 := newBundle(t, td, 1, 1, 0)
	v2 := withRoot(t, v1)
	publish := func(gen string, b *spiffebundle.Bundle) {
		require.NoError(t, os.Mkdir(filepath.Join(dir, gen), 0o755))
		writeBundle(t, filepath.Join(dir, gen, "bundle.json"), b)
		require.NoError(t, os.Symlink(gen, filepath.Join(dir, "..data_tmp")))
		require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	}
	publish("..2026_01_01", v1)
	require.NoError(t, os.Symlink(filepath.Join("..data", "bundle.json"), filepath.Join(dir, "bundle.json")))

	fs := bundleserver.NewFileSource(filepath.Join(dir, "bundle.json"), td, nil)
	require.NoError(t, fs.Load())
	assert.True(t, v1.Equal(fs.Bundle()))
	publish("..2026_01_02", v2)
	require.NoError(t, fs.Check())
	assert.True(t, v2.Equal(fs.Bundle()))
}

// TestFileSourceRunServes wires a FileSource into a Server the way cmd
// does, with Run polling on synctest's fake clock.
func TestFileSourceRunServes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "bundle.json")
		v1 := newBundle(t, td, 1, 1, 0)
		v2 := withRoot(t, v1)
		writeBundle(t, path, v1)
		fs := bundleserver.NewFileSource(path, td, nil)
		require.NoError(t, fs.Load())
		s := newServer(t, bundleserver.Config{Local: fs})

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = fs.Run(ctx, time.Minute)
		}()
		updated := make(chan struct{})
		go func() { // cmd's loop: Update on every change signal
			for {
				select {
				case <-ctx.Done():
					return
				case <-fs.Changes():
					_ = s.Update()
					updated <- struct{}{}
				}
			}
		}()
		<-updated // the signal of Load

		writeBundle(t, path, v2)
		time.Sleep(time.Minute) // fake time: the next poll
		<-updated
		w := do(s.Handler(), http.MethodGet, "/")
		got, _, err := bundledoc.Parse(td, w.Body.Bytes())
		require.NoError(t, err)
		assert.True(t, v2.Equal(got))

		cancel()
		<-done
	})
}

func TestFileSourceRefusesWhatPeersWouldRefuse(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bundle.json")
	good := testca.New(t, "example.org").Bundle()
	good.SetSequenceNumber(5)
	writeBundle(t, path, good)
	fs := bundleserver.NewFileSource(path, spiffeid.RequireTrustDomainFromString("example.org"), nil)
	require.NoError(t, fs.Load())

	older := good.Clone()
	older.SetSequenceNumber(3)
	other := testca.New(t, "example.org").Bundle()
	other.SetSequenceNumber(5)
	foreign := testca.New(t, "other.org").Bundle()
	foreign.SetSequenceNumber(9)
	hintOnly := good.Clone()
	hintOnly.SetRefreshHint(time.Minute)

	for _, tc := range []struct {
		name string
		b    *spiffebundle.Bundle
		want string
	}{
		{"sequence goes back", older, "went back from 5 to 3"},
		{"same sequence, other keys", other, "unchanged but the keys changed"},
		{"roots of another trust domain", foreign, `names trust domain "other.org"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeBundle(t, path, tc.b)
			err := fs.Check()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, good.Equal(fs.Bundle()), "last good kept")
			assert.Error(t, fs.LastError())
		})
	}
	writeBundle(t, path, hintOnly)
	require.NoError(t, fs.Check(), "a new refresh hint under the same sequence is fine")
}
