package authn

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sha256Of(token string) [32]byte { return sha256.Sum256([]byte(token)) }

func consumption(token string, id spiffeid.ID) Consumption {
	return Consumption{Ref: BootstrapGrantRef(sha256Of(token)), ID: id, At: epoch}
}

func TestFileLedger(t *testing.T) {
	path := filepath.Join(t.TempDir(), LedgerFileName)
	l, err := OpenFileLedger(path)
	require.NoError(t, err, "a missing file is an empty ledger")
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing is written before a consumption")
	ctx := context.Background()

	c := consumption(tokLaptop, laptopID)
	_, ok, err := l.Consumed(ctx, c.Ref)
	require.NoError(t, err)
	assert.False(t, ok)
	require.NoError(t, l.Consume(ctx, c))
	require.ErrorIs(t, l.Consume(ctx, c), ErrTokenConsumed)
	require.NoError(t, l.Consume(ctx, consumption(tokVM, vmID)))
	assert.Equal(t, 2, l.Len())

	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	reopened, err := OpenFileLedger(path)
	require.NoError(t, err)
	got, ok, err := reopened.Consumed(ctx, c.Ref)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, c, got)
	assert.Equal(t, 2, reopened.Len())
}

// TestFileLedgerWriteFailure: a consumption whose file cannot be written
// does not count, in memory either.
func TestFileLedgerWriteFailure(t *testing.T) {
	l, err := OpenFileLedger(filepath.Join(t.TempDir(), "missing-dir", LedgerFileName))
	require.NoError(t, err)
	c := consumption(tokLaptop, laptopID)
	require.Error(t, l.Consume(context.Background(), c))
	_, ok, err := l.Consumed(context.Background(), c.Ref)
	require.NoError(t, err)
	assert.False(t, ok)
}

// TestFileLedgerRefusesBadFiles: a ledger that does not parse stops the
// server rather than forgetting what it recorded.
func TestFileLedgerRefusesBadFiles(t *testing.T) {
	ref := BootstrapGrantRef(sha256Of(tokLaptop))
	for name, content := range map[string]string{
		"not JSON":       "garbage",
		"truncated":      `{"version":1,"consumed":{"` + ref + `":{"spiffe_id":"spiffe://example.org/a"`,
		"wrong version":  `{"version":2,"consumed":{}}`,
		"unknown field":  `{"version":1,"consumed":{},"extra":1}`,
		"bad reference":  `{"version":1,"consumed":{"` + tokLaptop + `":{"spiffe_id":"spiffe://example.org/a","consumed_at":"2026-01-01T00:00:00Z"}}}`,
		"upper-case ref": `{"version":1,"consumed":{"` + strings.ToUpper(ref) + `":{"spiffe_id":"spiffe://example.org/a","consumed_at":"2026-01-01T00:00:00Z"}}}`,
		"bad ID":         `{"version":1,"consumed":{"` + ref + `":{"spiffe_id":"https://example.org/a","consumed_at":"2026-01-01T00:00:00Z"}}}`,
		"no time":        `{"version":1,"consumed":{"` + ref + `":{"spiffe_id":"spiffe://example.org/a"}}}`,
		"two objects":    `{"version":1,"consumed":{}} {}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), LedgerFileName)
			require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
			_, err := OpenFileLedger(path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), path)
			assert.Contains(t, err.Error(), "restore it from a backup")
			assert.NotContains(t, err.Error(), tokLaptop)
		})
	}
	t.Run("directory", func(t *testing.T) {
		_, err := OpenFileLedger(t.TempDir())
		require.ErrorContains(t, err, "not a regular file")
	})
}

func TestLedgerRefusesMalformedConsumptions(t *testing.T) {
	for name, l := range map[string]TokenLedger{"memory": NewMemoryLedger(), "file": mustFileLedger(t)} {
		t.Run(name, func(t *testing.T) {
			for _, c := range []Consumption{
				{Ref: tokLaptop, ID: laptopID, At: epoch},
				{Ref: BootstrapGrantRef(sha256Of(tokLaptop)), At: epoch},
				{Ref: BootstrapGrantRef(sha256Of(tokLaptop)), ID: laptopID},
			} {
				assert.Error(t, l.Consume(context.Background(), c))
			}
		})
	}
}

func mustFileLedger(t *testing.T) *FileLedger {
	t.Helper()
	l, err := OpenFileLedger(filepath.Join(t.TempDir(), LedgerFileName))
	require.NoError(t, err)
	return l
}

func FuzzParseLedger(f *testing.F) {
	ref := BootstrapGrantRef(sha256Of(tokLaptop))
	for _, seed := range []string{
		"", "{}", "null", `{"version":1}`, `{"version":1,"consumed":{}}`,
		`{"version":1,"consumed":{"` + ref + `":{"spiffe_id":"spiffe://example.org/a","consumed_at":"2026-01-01T00:00:00Z"}}}`,
		`{"version":1,"consumed":{"` + ref + `":{"spiffe_id":"spiffe://example.org/a","consumed_at":"2026-01-01T00:00:00Z"},"` + ref + `":{}}}`,
		`{"version":1,"consumed":{"x":{}}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		consumed, err := parseLedger(data)
		if err != nil {
			return
		}
		for ref, c := range consumed {
			if ref != c.Ref || checkConsumption(c) != nil {
				t.Fatalf("accepted malformed entry %q: %+v", ref, c)
			}
		}
		// What was accepted encodes to a file that parses the same.
		again, err := encodeLedger(consumed)
		if err != nil {
			t.Fatal(err)
		}
		back, err := parseLedger(again)
		if err != nil {
			t.Fatalf("re-encoded ledger does not parse: %v", err)
		}
		if len(back) != len(consumed) {
			t.Fatalf("%d entries, then %d", len(consumed), len(back))
		}
		for ref, c := range consumed {
			if b := back[ref]; b.ID != c.ID || !b.At.Equal(c.At) {
				t.Fatalf("entry %s: %+v, then %+v", ref, c, b)
			}
		}
	})
}

func TestNewBootstrapToken(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok, err := NewBootstrapToken()
		require.NoError(t, err)
		require.NoError(t, checkBootstrapToken(tok), "a fresh token passes the file's own rules")
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		require.NoError(t, err)
		assert.Len(t, raw, 32)
		assert.False(t, seen[tok])
		seen[tok] = true
	}
}

func TestTokenLine(t *testing.T) {
	l := TokenLine{Token: tokLaptop, ID: laptopID, Expires: time.Date(2026, 12, 1, 11, 0, 0, 500, time.FixedZone("CET", 3600))}
	assert.Equal(t, tokLaptop+",spiffe://example.org/laptop/alice,expires=2026-12-01T10:00:00Z", l.String())
	l.Reusable = true
	assert.Equal(t, tokLaptop+",spiffe://example.org/laptop/alice,expires=2026-12-01T10:00:00Z,reusable", l.String())
	assert.Equal(t, tokLaptop+",spiffe://example.org/laptop/alice", TokenLine{Token: tokLaptop, ID: laptopID}.String())
	assert.Equal(t, BootstrapGrantRef(sha256Of(tokLaptop)), l.Ref())
}

// TestAppendBootstrapToken: lines are added to what is there, the file
// ends up 0600, a file the server would refuse is not extended, and
// concurrent appends lose nothing.
func TestAppendBootstrapToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens.csv")
	first := TokenLine{Token: tokLaptop, ID: laptopID, Expires: epoch}
	require.NoError(t, AppendBootstrapToken(path, first))
	second := TokenLine{Token: tokVM, ID: vmID, Reusable: true}
	require.NoError(t, AppendBootstrapToken(path, second))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, first.String()+"\n"+second.String()+"\n", string(data))
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	t.Run("no final newline, loose mode", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "tokens.csv")
		writeTokens(t, p, "# lab\n"+tokVM+",spiffe://example.org/vm/build", 0o644)
		require.NoError(t, AppendBootstrapToken(p, first))
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		assert.Equal(t, "# lab\n"+tokVM+",spiffe://example.org/vm/build\n"+first.String()+"\n", string(data))
		info, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	})
	for name, tc := range map[string]struct {
		content string
		line    TokenLine
		errHas  string
	}{
		"broken file":         {content: "short,spiffe://example.org/a\n", line: first, errHas: "line 1: token is 5 bytes"},
		"other trust domain":  {content: tokVM + ",spiffe://other.org/a\n", line: first, errHas: "does not load for trust domain example.org"},
		"same token twice":    {content: tokLaptop + ",spiffe://example.org/a\n", line: first, errHas: "line 2: token repeats the one on line 1"},
		"ID without a path":   {line: TokenLine{Token: tokLaptop, ID: spiffeid.RequireFromString("spiffe://example.org")}, errHas: "has no path"},
		"token of bad format": {line: TokenLine{Token: "short", ID: laptopID}, errHas: "token is 5 bytes"},
		"token with a space":  {line: TokenLine{Token: " " + tokLaptop, ID: laptopID}, errHas: "b64token"},
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "tokens.csv")
			if tc.content != "" {
				writeTokens(t, p, tc.content, 0o600)
			}
			err := AppendBootstrapToken(p, tc.line)
			require.ErrorContains(t, err, tc.errHas)
			assert.NotContains(t, err.Error(), tc.line.Token)
			data, _ := os.ReadFile(p)
			assert.Equal(t, tc.content, string(data), "the file is unchanged")
		})
	}

	t.Run("concurrent appends", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "tokens.csv")
		const n = 20
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				tok, err := NewBootstrapToken()
				if assert.NoError(t, err) {
					assert.NoError(t, AppendBootstrapToken(p, TokenLine{Token: tok, ID: laptopID}))
				}
			})
		}
		wg.Wait()
		b, err := LoadBootstrapTokens(p, localTD)
		require.NoError(t, err)
		assert.Equal(t, n, b.Len(), "no append lost")
	})
}

func FuzzTokenLine(f *testing.F) {
	f.Add(tokLaptop, "/laptop/alice", int64(1795000000), true)
	f.Add(tokVM, "/vm", int64(0), false)
	f.Add("bad token", "", int64(-1), false)
	f.Fuzz(func(t *testing.T, token, path string, unix int64, reusable bool) {
		id, err := spiffeid.FromPath(localTD, path)
		if err != nil || checkBootstrapToken(token) != nil {
			return
		}
		l := TokenLine{Token: token, ID: id, Reusable: reusable}
		if unix != 0 {
			l.Expires = time.Unix(unix, 0).UTC()
		}
		e, err := parseTokenLine(l.String(), localTD)
		if err != nil {
			return
		}
		if e.hash != sha256Of(token) || e.id != id || e.reusable != reusable || !e.expires.Equal(l.Expires) {
			t.Fatalf("line %q parsed as %+v", l.String(), e)
		}
	})
}
