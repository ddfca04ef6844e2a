package federation

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// lkgBundle is a bundle with an X.509 root, a JWT key, a sequence and a
// refresh hint, so a round trip shows every field survives.
func lkgBundle(t testing.TB, trustDomain string, seq uint64) *spiffebundle.Bundle {
	t.Helper()
	ca := testca.New(t, trustDomain)
	b := ca.Bundle()
	require.NoError(t, b.AddJWTAuthority("kid-<1>", testca.NewKey(t, testca.ECP256).Public()))
	b.SetSequenceNumber(seq)
	b.SetRefreshHint(90 * time.Second)
	return b
}

func lkgEntry(t testing.TB, trustDomain string, seq uint64) LKGEntry {
	t.Helper()
	return LKGEntry{
		TrustDomain: td(trustDomain),
		Bundle:      lkgBundle(t, trustDomain, seq),
		ETag:        `"v` + trustDomain + `"`,
		EndpointURL: "https://" + trustDomain + "/bundle",
		FetchedAt:   time.Date(2026, 11, 22, 5, 0, 0, 123456789, time.FixedZone("x", 3600)),
	}
}

func lkgFiles(t testing.TB, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestLKGRoundTrip(t *testing.T) {
	s := NewLKGStore(t.TempDir())
	want := lkgEntry(t, "example.org", 42)
	require.NoError(t, s.Save(want))

	got, err := s.Load(td("example.org"))
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, want.TrustDomain, got.TrustDomain)
	assert.True(t, want.Bundle.Equal(got.Bundle), "bundle changed in the round trip")
	seq, ok := got.Bundle.SequenceNumber()
	assert.True(t, ok)
	assert.Equal(t, uint64(42), seq)
	hint, ok := got.Bundle.RefreshHint()
	assert.True(t, ok)
	assert.Equal(t, 90*time.Second, hint)
	assert.Equal(t, want.ETag, got.ETag)
	assert.Equal(t, want.EndpointURL, got.EndpointURL)
	assert.True(t, want.FetchedAt.Equal(got.FetchedAt), "fetched_at %v != %v", got.FetchedAt, want.FetchedAt)
	assert.Equal(t, time.UTC, got.FetchedAt.Location())
}

func TestLKGFileFormat(t *testing.T) {
	s := NewLKGStore(t.TempDir())
	e := lkgEntry(t, "example.org", 7)
	require.NoError(t, s.Save(e))

	data, err := os.ReadFile(filepath.Join(s.Dir(), "example.org.json"))
	require.NoError(t, err)
	var env struct {
		TrustDomain string          `json:"trust_domain"`
		EndpointURL string          `json:"endpoint_url"`
		ETag        string          `json:"etag"`
		FetchedAt   string          `json:"fetched_at"`
		Bundle      json.RawMessage `json:"bundle"`
	}
	require.NoError(t, json.Unmarshal(data, &env))
	assert.Equal(t, "example.org", env.TrustDomain)
	assert.Equal(t, "https://example.org/bundle", env.EndpointURL)
	assert.Equal(t, `"vexample.org"`, env.ETag)
	assert.Equal(t, "2026-11-22T04:00:00.123456789Z", env.FetchedAt)
	// The bundle is the canonical document, byte for byte.
	doc, err := bundledoc.Marshal(e.Bundle)
	require.NoError(t, err)
	assert.Equal(t, string(doc), string(env.Bundle))
}

func TestLKGSaveReplaces(t *testing.T) {
	s := NewLKGStore(t.TempDir())
	require.NoError(t, s.Save(lkgEntry(t, "example.org", 1)))
	second := lkgEntry(t, "example.org", 2)
	require.NoError(t, s.Save(second))
	got, err := s.Load(td("example.org"))
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.True(t, second.Bundle.Equal(got.Bundle))
}

func TestLKGMissing(t *testing.T) {
	t.Run("no directory", func(t *testing.T) {
		s := NewLKGStore(filepath.Join(t.TempDir(), "nothing-here"))
		got, err := s.Load(td("example.org"))
		assert.NoError(t, err)
		assert.Nil(t, got)
		all, errs := s.LoadAll()
		assert.Empty(t, errs)
		assert.NotNil(t, all)
		assert.Empty(t, all)
		assert.NoError(t, s.Remove(td("example.org")))
	})
	t.Run("no file", func(t *testing.T) {
		s := NewLKGStore(t.TempDir())
		require.NoError(t, s.Save(lkgEntry(t, "other.org", 1)))
		got, err := s.Load(td("example.org"))
		assert.NoError(t, err)
		assert.Nil(t, got)
	})
}

func TestLKGLoadRefuses(t *testing.T) {
	valid := func(t *testing.T, trustDomain string) map[string]any {
		t.Helper()
		data, err := json.Marshal(lkgFile{
			TrustDomain: trustDomain,
			FetchedAt:   time.Now(),
			Bundle:      mustMarshal(t, lkgBundle(t, trustDomain, 1)),
		})
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(data, &m))
		return m
	}
	encode := func(t *testing.T, m map[string]any) []byte {
		t.Helper()
		data, err := json.Marshal(m)
		require.NoError(t, err)
		return data
	}
	for _, tc := range []struct {
		name    string
		content func(t *testing.T) []byte
		wantErr string
	}{
		{"empty file", func(*testing.T) []byte { return nil }, "envelope"},
		{"garbage", func(*testing.T) []byte { return []byte("not json at all") }, "envelope"},
		{"truncated", func(t *testing.T) []byte {
			d := encode(t, valid(t, "example.org"))
			return d[:len(d)/2]
		}, "envelope"},
		{"trailing garbage", func(t *testing.T) []byte {
			return append(encode(t, valid(t, "example.org")), "{}"...)
		}, "envelope"},
		{"envelope for another trust domain", func(t *testing.T) []byte {
			return encode(t, valid(t, "evil.org"))
		}, `holds the bundle of trust domain "evil.org", not "example.org"`},
		{"missing trust_domain", func(t *testing.T) []byte {
			m := valid(t, "example.org")
			delete(m, "trust_domain")
			return encode(t, m)
		}, "trust_domain is missing"},
		{"trust_domain as SPIFFE ID", func(t *testing.T) []byte {
			m := valid(t, "example.org")
			m["trust_domain"] = "spiffe://example.org"
			return encode(t, m)
		}, "trust_domain"},
		{"missing bundle", func(t *testing.T) []byte {
			m := valid(t, "example.org")
			delete(m, "bundle")
			return encode(t, m)
		}, "bundle is missing"},
		{"null bundle", func(t *testing.T) []byte {
			m := valid(t, "example.org")
			m["bundle"] = nil
			return encode(t, m)
		}, "bundle is missing"},
		{"bundle without keys", func(t *testing.T) []byte {
			m := valid(t, "example.org")
			m["bundle"] = map[string]any{"spiffe_sequence": 1}
			return encode(t, m)
		}, "bundle:"},
		{"bundle as string", func(t *testing.T) []byte {
			m := valid(t, "example.org")
			m["bundle"] = "{}"
			return encode(t, m)
		}, "bundle:"},
		{"non-CA root", func(t *testing.T) []byte {
			ca := testca.New(t, "example.org")
			leaf, _ := ca.Issue(t, spiffeid.RequireFromString("spiffe://example.org/w"))
			m := valid(t, "example.org")
			m["bundle"] = map[string]any{"keys": []any{map[string]any{
				"kty": "EC", "use": "x509-svid", "crv": "P-256",
				"x5c": []string{base64.StdEncoding.EncodeToString(leaf.Raw)},
			}}}
			return encode(t, m)
		}, "bundle:"},
		// A root naming another trust domain: the poller refuses such a
		// fetched bundle, so a stored one is refused too.
		{"root of another trust domain", func(t *testing.T) []byte {
			b := spiffebundle.FromX509Authorities(td("example.org"), testca.New(t, "evil.org").Bundle().X509Authorities())
			m := valid(t, "example.org")
			m["bundle"] = json.RawMessage(mustMarshal(t, b))
			return encode(t, m)
		}, "evil.org"},
		{"oversized", func(t *testing.T) []byte {
			m := valid(t, "example.org")
			m["padding"] = strings.Repeat("x", maxLKGFileSize)
			return encode(t, m)
		}, "too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewLKGStore(t.TempDir())
			require.NoError(t, os.MkdirAll(s.Dir(), 0o700))
			p := filepath.Join(s.Dir(), "example.org.json")
			require.NoError(t, os.WriteFile(p, tc.content(t), 0o644))

			got, err := s.Load(td("example.org"))
			require.Error(t, err)
			assert.Nil(t, got)
			assert.Contains(t, err.Error(), p, "the error must name the file")
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.True(t, strings.HasPrefix(err.Error(), "federation: "), err.Error())

			all, errs := s.LoadAll()
			assert.Empty(t, all)
			require.Len(t, errs, 1)
			assert.Contains(t, errs[0].Error(), p)
		})
	}
}

func TestLKGRenamedFileRefused(t *testing.T) {
	s := NewLKGStore(t.TempDir())
	require.NoError(t, s.Save(lkgEntry(t, "a.example", 1)))
	from := filepath.Join(s.Dir(), "a.example.json")
	to := filepath.Join(s.Dir(), "b.example.json")
	require.NoError(t, os.Rename(from, to))

	got, err := s.Load(td("b.example"))
	require.Error(t, err)
	assert.Nil(t, got)
	assert.Contains(t, err.Error(), to)
	assert.Contains(t, err.Error(), `holds the bundle of trust domain "a.example", not "b.example"`)

	got, err = s.Load(td("a.example"))
	assert.NoError(t, err)
	assert.Nil(t, got, "the renamed file must not count for its original trust domain either")
}

func TestLKGNotRegularFile(t *testing.T) {
	s := NewLKGStore(t.TempDir())
	p := filepath.Join(s.Dir(), "example.org.json")
	require.NoError(t, os.MkdirAll(p, 0o700))
	_, err := s.Load(td("example.org"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), p)
	assert.Contains(t, err.Error(), "not a regular file")
}

func TestLKGLoadAll(t *testing.T) {
	s := NewLKGStore(t.TempDir())
	good := map[string]LKGEntry{}
	for _, name := range []string{"a.example", "c.example", "e.example"} {
		good[name] = lkgEntry(t, name, 3)
		require.NoError(t, s.Save(good[name]))
	}
	write := func(name, content string) string {
		p := filepath.Join(s.Dir(), name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		return p
	}
	corrupt := write("b.example.json", "{garbage")
	badName := write("Not A Domain.json", "{}")
	// Stray files the store must ignore: a crash-left temp file, notes.
	write(".a.example.json.tmp-12345", "{half")
	write("README", "hello")
	// A file renamed from another trust domain.
	data, err := os.ReadFile(filepath.Join(s.Dir(), "e.example.json"))
	require.NoError(t, err)
	renamed := write("d.example.json", string(data))

	all, errs := s.LoadAll()
	require.Len(t, errs, 3, "%v", errs)
	// Errors come in file name order, each naming its file.
	assert.Contains(t, errs[0].Error(), badName)
	assert.Contains(t, errs[0].Error(), "not a trust domain")
	assert.Contains(t, errs[1].Error(), corrupt)
	assert.Contains(t, errs[2].Error(), renamed)

	require.Len(t, all, 3)
	for name, want := range good {
		got := all[td(name)]
		require.NotNil(t, got, name)
		assert.Equal(t, td(name), got.TrustDomain)
		assert.True(t, want.Bundle.Equal(got.Bundle), name)
		assert.Equal(t, want.ETag, got.ETag)
	}
}

func TestLKGPermissions(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("POSIX permissions")
	}
	s := NewLKGStore(t.TempDir())
	require.NoError(t, s.Save(lkgEntry(t, "example.org", 1)))

	di, err := os.Stat(s.Dir())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), di.Mode().Perm())
	fi, err := os.Stat(filepath.Join(s.Dir(), "example.org.json"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
}

func TestLKGNoTempFilesLeft(t *testing.T) {
	s := NewLKGStore(t.TempDir())
	for seq := range uint64(5) {
		require.NoError(t, s.Save(lkgEntry(t, "example.org", seq)))
		require.NoError(t, s.Save(lkgEntry(t, "other.org", seq)))
	}
	assert.Equal(t, []string{"example.org.json", "other.org.json"}, lkgFiles(t, s.Dir()))

	// A failed save leaves neither a temp file nor a changed entry.
	bad := lkgEntry(t, "example.org", 9)
	bad.Bundle = spiffebundle.New(td("other.org"))
	require.Error(t, s.Save(bad))
	assert.Equal(t, []string{"example.org.json", "other.org.json"}, lkgFiles(t, s.Dir()))
}

func TestLKGSaveRefuses(t *testing.T) {
	ca := testca.New(t, "example.org")
	leaf, _ := ca.Issue(t, spiffeid.RequireFromString("spiffe://example.org/w"))
	nonCA := spiffebundle.New(td("example.org"))
	nonCA.AddX509Authority(leaf)
	huge := spiffebundle.New(td("example.org"))
	pub := testca.NewKey(t, testca.ECP256).Public()
	for i := range 12 {
		// Long key IDs make a valid bundle past the file cap cheaply.
		require.NoError(t, huge.AddJWTAuthority(fmt.Sprintf("%02d-%s", i, strings.Repeat("k", 100<<10)), pub))
	}

	for _, tc := range []struct {
		name    string
		entry   LKGEntry
		wantErr string
	}{
		{"no trust domain", LKGEntry{Bundle: ca.Bundle()}, "no trust domain"},
		{"no bundle", LKGEntry{TrustDomain: td("example.org")}, "no bundle"},
		{"bundle of another trust domain", LKGEntry{TrustDomain: td("other.org"), Bundle: ca.Bundle()}, `bundle is for trust domain "example.org"`},
		{"name bundledoc refuses", LKGEntry{TrustDomain: td("a..b"), Bundle: spiffebundle.New(td("a..b"))}, "empty label"},
		{"bundle Marshal refuses", LKGEntry{TrustDomain: td("example.org"), Bundle: nonCA}, "keys[0]"},
		{"larger than Load reads", LKGEntry{TrustDomain: td("example.org"), Bundle: huge}, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewLKGStore(t.TempDir())
			err := s.Save(tc.entry)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.True(t, strings.HasPrefix(err.Error(), "federation: "), err.Error())
			_, statErr := os.Stat(filepath.Join(s.Dir(), "example.org.json"))
			assert.True(t, os.IsNotExist(statErr))
		})
	}
}

func TestLKGRemove(t *testing.T) {
	s := NewLKGStore(t.TempDir())
	require.NoError(t, s.Save(lkgEntry(t, "example.org", 1)))
	require.NoError(t, s.Save(lkgEntry(t, "other.org", 1)))
	require.NoError(t, s.Remove(td("example.org")))
	got, err := s.Load(td("example.org"))
	assert.NoError(t, err)
	assert.Nil(t, got)
	assert.NoError(t, s.Remove(td("example.org")), "removing twice is fine")
	got, err = s.Load(td("other.org"))
	assert.NoError(t, err)
	assert.NotNil(t, got, "other trust domains are untouched")
	assert.Error(t, s.Remove(spiffeid.TrustDomain{}))
}

func TestNewLKGStoreTouchesNothing(t *testing.T) {
	dir := t.TempDir()
	s := NewLKGStore(dir)
	assert.Equal(t, filepath.Join(dir, "federation"), s.Dir())
	assert.Empty(t, lkgFiles(t, dir))
}

func mustMarshal(t testing.TB, b *spiffebundle.Bundle) []byte {
	t.Helper()
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	return doc
}

// FuzzLoadLKG feeds arbitrary file contents to Load: it never panics, and
// whatever it accepts is for the requested trust domain and survives a
// Save/Load round trip unchanged.
func FuzzLoadLKG(f *testing.F) {
	s := NewLKGStore(f.TempDir())
	require.NoError(f, s.Save(lkgEntry(f, "example.org", 5)))
	valid, err := os.ReadFile(filepath.Join(s.Dir(), "example.org.json"))
	require.NoError(f, err)
	f.Add(valid)
	f.Add([]byte(`{"trust_domain":"example.org","bundle":{"keys":[]}}`))
	f.Add([]byte(`{"trust_domain":"other.org","bundle":{"keys":[]}}`))
	f.Add([]byte(`{"trust_domain":"example.org","bundle":null}`))
	f.Add([]byte(`{"trust_domain":"example.org","fetched_at":"yesterday","bundle":{"keys":[]}}`))
	f.Add([]byte(`[]`))
	f.Add([]byte{})
	f.Add([]byte(`{"trust_domain":"example.org","bundle":{"keys":[]},"revoked":[{"use":"jwt-svid","kid":"k","exp":1767225600,"since":"2026-12-01T00:00:00Z","sequence":3}]}`))
	f.Add([]byte(`{"trust_domain":"example.org","bundle":{"keys":[]},"revoked":[{"use":"x509-svid","x5t#S256":"47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU","exp":1,"since":"2026-12-01T00:00:00Z"},{"use":"jwt-svid","kid":"k","exp":2}]}`))
	f.Add([]byte(`{"trust_domain":"example.org","bundle":{"keys":[]},"revoked":{}}`))

	f.Fuzz(func(t *testing.T, data []byte) {
		s := NewLKGStore(t.TempDir())
		require.NoError(t, os.MkdirAll(s.Dir(), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(s.Dir(), "example.org.json"), data, 0o644))
		e, err := s.Load(td("example.org"))
		if err != nil {
			assert.Nil(t, e)
			return
		}
		require.NotNil(t, e)
		assert.Equal(t, td("example.org"), e.TrustDomain)
		assert.Equal(t, td("example.org"), e.Bundle.TrustDomain())
		require.NoError(t, s.Save(*e))
		again, err := s.Load(td("example.org"))
		require.NoError(t, err)
		assert.True(t, e.Bundle.Equal(again.Bundle))
		assert.Equal(t, e.ETag, again.ETag)
		assert.Equal(t, e.EndpointURL, again.EndpointURL)
		assert.True(t, e.FetchedAt.Equal(again.FetchedAt))
		require.Len(t, again.Revoked, len(e.Revoked))
		for i, r := range e.Revoked {
			assert.Equal(t, r.ID(), again.Revoked[i].ID())
			assert.True(t, r.NotAfter.Equal(again.Revoked[i].NotAfter) && r.Since.Equal(again.Revoked[i].Since))
		}
	})
}
