package bundleserver_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// servedBundle fetches path over HTTPS from srv and parses the body as a
// bundle of trust domain want.
func servedBundle(t *testing.T, srv *httptest.Server, path string, want spiffeid.TrustDomain) *spiffebundle.Bundle {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, body)
	b, _, err := bundledoc.Parse(want, body)
	require.NoError(t, err)
	return b
}

func startTLS(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func TestEndpointServesCAUnlessAStaticFileReplacesIt(t *testing.T) {
	dir := t.TempDir()
	ca := newBundle(t, td, 1, 1, time.Minute)
	offline := newBundle(t, td, 1, 41, 0)
	static := filepath.Join(dir, "static.json")
	writeBundle(t, static, offline)

	t.Run("the CA without files", func(t *testing.T) {
		e, err := bundleserver.NewEndpoint(bundleserver.EndpointConfig{Config: bundleserver.Config{TrustDomain: td, Local: newSource(ca)}})
		require.NoError(t, err)
		srv := startTLS(t, e.Server().Handler())
		assert.True(t, ca.Equal(servedBundle(t, srv, "/", td)))
		assert.Empty(t, e.Files())
		assert.NoError(t, e.Ready())
	})
	t.Run("static mode", func(t *testing.T) {
		var logs testlog.Buffer
		e, err := bundleserver.NewEndpoint(bundleserver.EndpointConfig{
			Config: bundleserver.Config{TrustDomain: td, Local: newSource(ca), RefreshHint: 2 * time.Minute,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))},
			Files: []string{static},
		})
		require.NoError(t, err)
		srv := startTLS(t, e.Server().Handler())
		got := servedBundle(t, srv, "/", td)
		assert.True(t, got.X509Authorities()[0].Equal(offline.X509Authorities()[0]), "the file's bundle, not the CA's")
		seq, _ := got.SequenceNumber()
		assert.Equal(t, uint64(41), seq)
		hint, _ := got.RefreshHint()
		assert.Equal(t, 2*time.Minute, hint, "the configured hint fills in a file without one")
		assert.Contains(t, logs.String(), "static mode")
		assert.Contains(t, logs.String(), "component=bundle-endpoint")
		require.Len(t, e.Files(), 1)
		assert.Equal(t, static, e.Files()[0].Path())
	})
}

func TestEndpointRelaysFilesBesideFederatedBundles(t *testing.T) {
	dir := t.TempDir()
	east, west := newBundle(t, eastTD, 1, 1, 0), newBundle(t, westTD, 1, 1, 0)
	eastFile := filepath.Join(dir, "east.json")
	writeBundle(t, eastFile, east)
	relayed := map[string]*spiffebundle.Bundle{}
	e, err := bundleserver.NewEndpoint(bundleserver.EndpointConfig{
		Config: bundleserver.Config{TrustDomain: td, Local: newSource(newBundle(t, td, 1, 1, 0)), ServeOthers: true,
			Others: func() []*spiffebundle.Bundle { return []*spiffebundle.Bundle{west} }},
		Files:     []string{"east.example=" + eastFile},
		OnRelayed: func(path string, b *spiffebundle.Bundle) { relayed[path] = b },
	})
	require.NoError(t, err)
	srv := startTLS(t, e.Server().Handler())
	assert.True(t, east.Equal(servedBundle(t, srv, "/bundles/east.example", eastTD)), "the relayed file")
	assert.True(t, west.Equal(servedBundle(t, srv, "/bundles/west.example", westTD)), "the federated bundle")
	require.Len(t, relayed, 1, "the relayed file is handed on at once")
	assert.True(t, east.Equal(relayed[eastFile]))
}

func TestNewEndpointRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "east.json")
	writeBundle(t, good, newBundle(t, eastTD, 1, 1, 0))
	tests := []struct {
		name  string
		files []string
		spec  string
		want  string
	}{
		{"invalid trust domain", []string{"Not A TD=" + good}, "Not A TD=" + good, `trust domain "Not A TD"`},
		{"missing file", []string{"east.example=" + filepath.Join(dir, "none.json")}, "east.example=" + filepath.Join(dir, "none.json"), "no such file"},
		{"two files for one trust domain", []string{"east.example=" + good, "east.example=" + good}, "east.example=" + good,
			`trust domain east.example already comes from "east.example=` + good + `"`},
		{"the wrong trust domain in the file", []string{"west.example=" + good}, "west.example=" + good, "east.example"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := bundleserver.NewEndpoint(bundleserver.EndpointConfig{
				Config: bundleserver.Config{TrustDomain: td, Local: newSource(newBundle(t, td, 1, 1, 0))},
				Files:  tt.files,
			})
			var fe *bundleserver.FileError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tt.spec, fe.Spec)
			assert.Contains(t, fe.Err.Error(), tt.want)
			assert.Contains(t, err.Error(), "bundleserver: bundle file ")
		})
	}
}

// TestEndpointRunFollowsChanges runs on synctest's fake time: a signalled
// change of the local source, a file change at the next poll and a
// periodic update without a signal all reach the served documents, and a
// bad file change shows in Ready while the last good bundle stays served.
func TestEndpointRunFollowsChanges(t *testing.T) {
	dir := t.TempDir()
	v1 := newBundle(t, td, 1, 1, 0)
	v2 := withRoot(t, v1)
	v3 := withRoot(t, v2)
	east1 := newBundle(t, eastTD, 1, 1, 0)
	east2 := withRoot(t, east1)
	eastFile := filepath.Join(dir, "east.json")
	writeBundle(t, eastFile, east1)

	synctest.Test(t, func(t *testing.T) {
		local := newSource(v1)
		changes := make(chan struct{}, 1)
		var mu sync.Mutex
		relayed := map[string]*spiffebundle.Bundle{}
		e, err := bundleserver.NewEndpoint(bundleserver.EndpointConfig{
			Config:  bundleserver.Config{TrustDomain: td, Local: local, ServeOthers: true},
			Changes: []<-chan struct{}{changes},
			Files:   []string{"east.example=" + eastFile},
			OnRelayed: func(path string, b *spiffebundle.Bundle) {
				mu.Lock()
				defer mu.Unlock()
				relayed[path] = b
			},
			FilePollInterval: time.Second,
			UpdateInterval:   time.Minute,
		})
		require.NoError(t, err)
		h := e.Server().Handler()
		served := func(path string, want spiffeid.TrustDomain) *spiffebundle.Bundle {
			rec := do(h, http.MethodGet, path)
			require.Equal(t, http.StatusOK, rec.Code)
			b, _, err := bundledoc.Parse(want, rec.Body.Bytes())
			require.NoError(t, err)
			return b
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()

		local.Set(v2)
		changes <- struct{}{}
		synctest.Wait()
		assert.True(t, v2.Equal(served("/", td)), "a signalled change is served at once")

		writeBundle(t, eastFile, east2)
		time.Sleep(time.Second) // the file's next poll
		synctest.Wait()
		assert.True(t, east2.Equal(served("/bundles/east.example", eastTD)), "a file change is served after its poll")
		mu.Lock()
		assert.True(t, east2.Equal(relayed[eastFile]), "and handed on")
		mu.Unlock()

		local.Set(v3) // no signal
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.True(t, v3.Equal(served("/", td)), "the periodic update catches a missed signal")

		require.NoError(t, os.WriteFile(eastFile, []byte("{broken"), 0o600))
		time.Sleep(time.Second)
		synctest.Wait()
		var fe *bundleserver.FileError
		require.ErrorAs(t, e.Ready(), &fe)
		assert.Equal(t, "east.example="+eastFile, fe.Spec)
		assert.Contains(t, fe.Err.Error(), "(serving the last good bundle)")
		assert.True(t, east2.Equal(served("/bundles/east.example", eastTD)), "the last good bundle stays served")

		cancel()
		assert.NoError(t, <-done)
	})
}

func TestEndpointRunStopsOnAClosedChangeChannel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		changes := make(chan struct{})
		e, err := bundleserver.NewEndpoint(bundleserver.EndpointConfig{
			Config:  bundleserver.Config{TrustDomain: td, Local: newSource(newBundle(t, td, 1, 1, 0))},
			Changes: []<-chan struct{}{changes},
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		close(changes) // a subscription cancelled before Run ends
		synctest.Wait()
		cancel()
		assert.NoError(t, <-done)
	})
}
