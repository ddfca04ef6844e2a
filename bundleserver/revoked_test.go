package bundleserver_test

import (
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// revSource is a Source and RevocationSource whose bundle and entries
// tests replace.
type revSource struct {
	source
	revs atomic.Pointer[[]bundledoc.Revocation]
}

func (s *revSource) Revocations() []bundledoc.Revocation {
	if p := s.revs.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *revSource) SetRevocations(revs ...bundledoc.Revocation) { s.revs.Store(&revs) }

// served is the body and ETag of GET path.
func served(t *testing.T, h http.Handler, path string) (body []byte, etag string) {
	t.Helper()
	rec := do(h, http.MethodGet, path)
	require.Equal(t, http.StatusOK, rec.Code)
	return rec.Body.Bytes(), rec.Header().Get("ETag")
}

func revokedIn(t *testing.T, body []byte) []bundledoc.Revocation {
	t.Helper()
	revs, err := bundledoc.ParseRevocations(body)
	require.NoError(t, err)
	return revs
}

func TestServesRevocationsFromTheSource(t *testing.T) {
	gone := testca.New(t, td.Name()).Cert
	jwtGone := bundledoc.Revocation{Use: bundledoc.UseJWTSVID, KID: "k1", NotAfter: time.Now().Add(time.Hour).Truncate(time.Second)}
	b := newBundle(t, td, 1, 7, 0)
	src := &revSource{}
	src.Set(b)
	src.SetRevocations(bundledoc.RevokeX509(gone))
	s := newServer(t, bundleserver.Config{Local: src})

	body, etag := served(t, s.Handler(), "/")
	assert.Equal(t, []bundledoc.Revocation{bundledoc.RevokeX509(gone)}, revokedIn(t, body))
	parsed, _, err := bundledoc.Parse(td, body)
	require.NoError(t, err)
	assert.True(t, b.Equal(parsed), "the keys are the bundle's")

	// Rendered once: the same bundle and equal entries (a new slice)
	// reuse the document, so the ETag stays.
	doc := s.LocalDocument()
	require.NoError(t, s.Update())
	src.SetRevocations(bundledoc.RevokeX509(gone))
	require.NoError(t, s.Update())
	assert.Same(t, doc, s.LocalDocument())
	_, again := served(t, s.Handler(), "/")
	assert.Equal(t, etag, again)

	// The next revocation moves the sequence and the entries: a new
	// document with both.
	src.Set(withRoot(t, b))
	src.SetRevocations(bundledoc.RevokeX509(gone), jwtGone)
	require.NoError(t, s.Update())
	body, next := served(t, s.Handler(), "/")
	assert.NotEqual(t, etag, next)
	assert.Len(t, revokedIn(t, body), 2)
}

func TestRefusesRevocationsOfCarriedAuthorities(t *testing.T) {
	b := newBundle(t, td, 2, 3, 0)
	src := &revSource{}
	src.Set(b)
	s := newServer(t, bundleserver.Config{Local: src})
	_, etag := served(t, s.Handler(), "/")

	// Entries that do not go with the bundle (a source publishing them
	// before the bundle that drops the root): peers would refuse the
	// document, so the last good one stays served.
	src.SetRevocations(bundledoc.RevokeX509(b.X509Authorities()[0]))
	err := s.Update()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "still carries")
	body, again := served(t, s.Handler(), "/")
	assert.Equal(t, etag, again)
	assert.Empty(t, revokedIn(t, body))
}

func TestRelaysRevocationsOfABundleFile(t *testing.T) {
	dir := t.TempDir()
	east := newBundle(t, eastTD, 1, 4, 0)
	revs := []bundledoc.Revocation{bundledoc.RevokeX509(testca.New(t, eastTD.Name()).Cert)}
	doc, err := bundledoc.MarshalWithRevocations(east, revs)
	require.NoError(t, err)
	eastFile := filepath.Join(dir, "east.json")
	require.NoError(t, os.WriteFile(eastFile, doc, 0o644))

	e, err := bundleserver.NewEndpoint(bundleserver.EndpointConfig{
		Config: bundleserver.Config{TrustDomain: td, Local: newSource(newBundle(t, td, 1, 1, 0)), ServeOthers: true},
		Files:  []string{"east.example=" + eastFile},
	})
	require.NoError(t, err)
	body, _ := served(t, e.Server().Handler(), "/bundles/east.example")
	assert.Equal(t, revs, revokedIn(t, body), "the relay serves what the file had")
	body, _ = served(t, e.Server().Handler(), "/")
	assert.Empty(t, revokedIn(t, body), "the local bundle lists none")
}

func TestFileSourceRefusesAFileRevokingWhatItCarries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.json")
	b := newBundle(t, td, 1, 1, 0)
	writeBundle(t, path, b)
	fs := bundleserver.NewFileSource(path, td, nil)
	require.NoError(t, fs.Load())

	// The operator revoked the root but forgot to take it out.
	bad := withRoot(t, b)
	doc, err := bundledoc.Marshal(bad)
	require.NoError(t, err)
	doc = append(doc[:len(doc)-1], []byte(`,"trustbridge_revoked":[{"use":"x509-svid","x5t#S256":"`+bundledoc.X509Thumbprint(b.X509Authorities()[0])+`","exp":4102444800}]}`)...)
	require.NoError(t, os.WriteFile(path, doc, 0o644))
	err = fs.Check()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "still carries")
	assert.True(t, b.Equal(fs.Bundle()), "the last good bundle stays")
	assert.Empty(t, fs.Revocations())

	// Fixed: the root is gone and listed.
	fixed := spiffebundle.New(td)
	fixed.AddX509Authority(bad.X509Authorities()[1])
	fixed.SetSequenceNumber(3)
	good, err := bundledoc.MarshalWithRevocations(fixed, []bundledoc.Revocation{bundledoc.RevokeX509(b.X509Authorities()[0])})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, good, 0o644))
	require.NoError(t, fs.Check())
	assert.True(t, fixed.Equal(fs.Bundle()))
	assert.Len(t, fs.Revocations(), 1)
}
