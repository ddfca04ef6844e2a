package bundleserver_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// TestConcurrentUpdatesAndRequests runs Update from two goroutines while
// others request every route. Under -race it finds unsynchronised access;
// the checks find torn reads: every response must be one whole document
// whose ETag is the digest of exactly its body.
func TestConcurrentUpdatesAndRequests(t *testing.T) {
	const (
		versions = 8
		readers  = 4
		updates  = 50  // per updater
		requests = 150 // per reader
	)
	bundles := []*spiffebundle.Bundle{newBundle(t, td, 1, 1, 0)}
	for len(bundles) < versions {
		bundles = append(bundles, withRoot(t, bundles[len(bundles)-1]))
	}
	known := map[string]bool{}
	for _, b := range bundles {
		doc, err := bundledoc.Marshal(b)
		require.NoError(t, err)
		known[string(doc)] = true
	}
	east := newBundle(t, eastTD, 1, 1, 0)
	src := newSource(bundles[0])
	s := newServer(t, bundleserver.Config{Local: src, ServeOthers: true,
		Others: func() []*spiffebundle.Bundle { return []*spiffebundle.Bundle{east} }})

	var wg sync.WaitGroup
	for u := range 2 {
		wg.Go(func() {
			for i := range updates {
				src.Set(bundles[(i*3+u)%versions])
				if err := s.Update(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range readers {
		wg.Go(func() {
			for i := range requests {
				target := []string{"/", "/bundles/example.org", "/bundle-map"}[i%3]
				w := do(s.Handler(), http.MethodGet, target)
				if !assert.Equal(t, http.StatusOK, w.Code) {
					return
				}
				body := w.Body.Bytes()
				sum := sha256.Sum256(body)
				assert.Equal(t, `"`+hex.EncodeToString(sum[:16])+`"`, w.Header().Get("ETag"))
				if target == "/bundle-map" {
					bs, _, err := bundledoc.ParseMap(body)
					assert.NoError(t, err)
					assert.Len(t, bs, 2)
				} else {
					assert.True(t, known[string(body)], "a document no version renders to")
				}
			}
		})
	}
	wg.Wait()
}
