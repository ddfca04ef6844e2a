package authn

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A token file is listed without its tokens, each named by its reference;
// removing one by a prefix of its reference keeps the comments and other
// lines byte for byte, and a reload stops the token at once.
func TestListAndRemoveBootstrapTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	td := spiffeid.RequireTrustDomainFromString("example.org")
	exp := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	a := TokenLine{Token: "aaaaaaaaaaaaaaaaaaaaaaaa", ID: spiffeid.RequireFromPath(td, "/vm/a"), Expires: exp}
	b := TokenLine{Token: "bbbbbbbbbbbbbbbbbbbbbbbb", ID: spiffeid.RequireFromPath(td, "/vm/b"), Reusable: true}
	content := "# lab tokens\n" + a.String() + "\n\n" + b.String() + "\n"
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	boot, err := LoadBootstrapTokens(path, td)
	require.NoError(t, err)
	require.Equal(t, 2, boot.Len())

	infos, err := ListBootstrapTokens(path)
	require.NoError(t, err)
	assert.Equal(t, []TokenInfo{
		{Ref: a.Ref(), ID: a.ID, Line: 2, Expires: exp},
		{Ref: b.Ref(), ID: b.ID, Line: 4, Reusable: true},
	}, infos)

	_, err = RemoveBootstrapToken(path, a.Ref()[:7])
	assert.ErrorContains(t, err, "give at least 8 of its hex digits")
	_, err = RemoveBootstrapToken(path, "00000000")
	assert.ErrorContains(t, err, "has reference 00000000")

	got, err := RemoveBootstrapToken(path, a.Ref()[:8])
	require.NoError(t, err)
	assert.Equal(t, a.ID, got.ID)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "# lab tokens\n\n"+b.String()+"\n", string(data))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	counts, err := boot.ReloadCounted()
	require.NoError(t, err)
	assert.Equal(t, TokenReload{Tokens: 1, Removed: 1}, counts)
	assert.Equal(t, 1, boot.Len())
	_, err = boot.Authenticate(t.Context(), Request{BearerToken: a.Token})
	assert.Error(t, err, "the revoked token no longer authenticates")
	_, err = boot.Authenticate(t.Context(), Request{BearerToken: b.Token})
	assert.NoError(t, err)

	c := TokenLine{Token: "cccccccccccccccccccccccc", ID: spiffeid.RequireFromPath(td, "/vm/c")}
	require.NoError(t, AppendBootstrapToken(path, c))
	counts, err = boot.ReloadCounted()
	require.NoError(t, err)
	assert.Equal(t, TokenReload{Tokens: 2, Added: 1}, counts)
	counts, err = boot.ReloadCounted()
	require.NoError(t, err)
	assert.Equal(t, TokenReload{Tokens: 2}, counts, "nothing changed")
}

// A token file a server reads through its group (0640 root:trustbridge)
// keeps its mode when a token is removed: were it made 0600, the server
// could no longer reload it and the revoked token would stay in force.
func TestRemoveBootstrapTokenKeepsMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving the file to the service's group needs root")
	}
	path := filepath.Join(t.TempDir(), "tokens")
	td := spiffeid.RequireTrustDomainFromString("example.org")
	a := TokenLine{Token: "aaaaaaaaaaaaaaaaaaaaaaaa", ID: spiffeid.RequireFromPath(td, "/vm/a")}
	b := TokenLine{Token: "bbbbbbbbbbbbbbbbbbbbbbbb", ID: spiffeid.RequireFromPath(td, "/vm/b")}
	require.NoError(t, os.WriteFile(path, []byte(a.String()+"\n"+b.String()+"\n"), 0o600))
	require.NoError(t, os.Chown(path, 0, 65534))
	require.NoError(t, os.Chmod(path, 0o640))
	got, err := RemoveBootstrapToken(path, b.Ref())
	require.NoError(t, err)
	assert.Equal(t, TokenInfo{Ref: b.Ref(), ID: b.ID, Line: 2}, got)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), fi.Mode().Perm())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, a.String()+"\n", string(data))
}

// A file that would not load is neither listed nor changed; an empty one
// lists nothing.
func TestListBootstrapTokensErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(bad, []byte("aaaaaaaaaaaaaaaaaaaaaaaa,spiffe://example.org/a\nbbbbbbbbbbbbbbbbbbbbbbbb,spiffe://other.org/b\n"), 0o600))
	_, err := ListBootstrapTokens(bad)
	assert.ErrorContains(t, err, "line 2: spiffe://other.org/b is not in trust domain example.org")
	_, err = RemoveBootstrapToken(bad, "0123456789")
	assert.ErrorContains(t, err, "line 2")

	swapped := filepath.Join(dir, "swapped")
	require.NoError(t, os.WriteFile(swapped, []byte("spiffe://example.org/a,aaaaaaaaaaaaaaaaaaaaaaaa\n"), 0o600))
	_, err = ListBootstrapTokens(swapped)
	assert.ErrorContains(t, err, "line 1")
	assert.NotContains(t, err.Error(), "aaaaaaaaaaaaaaaa", "a token is never echoed")

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("# none yet\n"), 0o600))
	infos, err := ListBootstrapTokens(empty)
	require.NoError(t, err)
	assert.Empty(t, infos)
}

// A prefix that two references share names neither.
func TestPickByRefAmbiguous(t *testing.T) {
	infos := []TokenInfo{{Ref: "0123456789abcdef", Line: 1}, {Ref: "0123456789fedcba", Line: 2}}
	_, err := pickByRef(infos, "01234567", "tokens")
	assert.EqualError(t, err, "authn: reference 01234567 names several tokens of tokens; give more of its digits")
	got, err := pickByRef(infos, "0123456789f", "tokens")
	require.NoError(t, err)
	assert.Equal(t, 2, got.Line)
}

// The trust domain a listing takes from the file's first token line: what
// it accepts, it accepts for one trust domain only, the first line's; and
// removing an accepted line by its number leaves a file that loads with
// one token fewer.
func FuzzParseForItsTrustDomain(f *testing.F) {
	for _, seed := range []string{
		"",
		"# comment\n\n",
		tokLaptop + ",spiffe://example.org/a\n" + tokVM + ",spiffe://example.org/b,reusable\n",
		"\xef\xbb\xbf# c\n" + tokLaptop + ", spiffe://other.org/a \r\n",
		tokLaptop + ",spiffe://example.org/a\n" + tokVM + ",spiffe://other.org/b\n",
		"spiffe://example.org/a," + tokLaptop + "\n",
		tokLaptop + "\n",
		tokLaptop + ",spiffe://example.org/a,expires=2026-12-01T10:00:00Z",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := parseForItsTrustDomain(data)
		if err != nil || len(set.entries) == 0 {
			return
		}
		td := set.entries[0].id.TrustDomain()
		for _, e := range set.entries {
			if !e.id.MemberOf(td) {
				t.Fatalf("%s accepted beside %s", e.id, td)
			}
		}
		lines := strings.SplitAfter(string(data), "\n")
		n := set.entries[0].line
		rest := strings.Join(append(slices.Clone(lines[:n-1]), lines[n:]...), "")
		after, err := parseBootstrapTokens([]byte(rest), td)
		require.NoError(t, err)
		assert.Len(t, after.entries, len(set.entries)-1)
	})
}
