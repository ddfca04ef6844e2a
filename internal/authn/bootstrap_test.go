package authn

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"
)

const (
	tokLaptop = "laptop-0123456789abcdefABCDEF"
	tokVM     = "vm+token/0123456789abcdef=="
	tokVM2    = "second-vm-token-0123456789"
)

var (
	laptopID = spiffeid.RequireFromString("spiffe://example.org/laptop/alice")
	vmID     = spiffeid.RequireFromString("spiffe://example.org/vm/build")
)

func writeTokens(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), mode))
	require.NoError(t, os.Chmod(path, mode)) // WriteFile keeps the mode of an existing file
}

func TestBootstrapTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.csv")
	writeTokens(t, path, "\xef\xbb\xbf# bootstrap tokens\r\n"+
		tokLaptop+",spiffe://example.org/laptop/alice\r\n"+
		"\n"+
		"   # indented comment\n"+
		"  "+tokVM+" ,\tspiffe://example.org/vm/build  \n"+
		tokVM2+",spiffe://example.org/vm/build", 0o600)
	b, err := LoadBootstrapTokens(path, localTD)
	require.NoError(t, err)
	assert.Equal(t, 3, b.Len())
	assert.Empty(t, b.Warnings())
	assert.NoError(t, b.Err())

	tests := []struct {
		name    string
		req     Request
		want    spiffeid.ID
		wantErr error
		errHas  string
	}{
		{name: "first entry", req: Request{BearerToken: tokLaptop}, want: laptopID},
		{name: "middle entry", req: Request{BearerToken: tokVM}, want: vmID},
		{name: "last entry, same ID as another", req: Request{BearerToken: tokVM2}, want: vmID},
		{name: "unknown token", req: Request{BearerToken: "nobody-0123456789abcdef"}, wantErr: ErrInvalidCredentials, errHas: "matches no bootstrap token"},
		{name: "prefix of a token", req: Request{BearerToken: tokLaptop[:20]}, wantErr: ErrInvalidCredentials},
		{name: "token plus suffix", req: Request{BearerToken: tokLaptop + "x"}, wantErr: ErrInvalidCredentials},
		{name: "case differs", req: Request{BearerToken: strings.ToUpper(tokLaptop)}, wantErr: ErrInvalidCredentials},
		{name: "no token", wantErr: ErrNoCredentials},
		{name: "unusable authorization metadata", req: Request{AuthorizationError: assert.AnError}, wantErr: ErrInvalidCredentials},
		{name: "oversized", req: Request{BearerToken: strings.Repeat("a", MaxTokenSize+1)}, wantErr: ErrInvalidCredentials, errHas: "more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := b.Authenticate(context.Background(), tt.req)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Contains(t, err.Error(), "authn: bootstrap-token: ")
				assert.Contains(t, err.Error(), tt.errHas)
				if tt.req.BearerToken != "" {
					assert.NotContains(t, err.Error(), tt.req.BearerToken)
				}
				assert.Zero(t, id)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, Identity{ID: tt.want, Method: MethodBootstrapToken}, idOnly(id))
		})
	}
}

func TestParseBootstrapTokens(t *testing.T) {
	const good = tokLaptop + ",spiffe://example.org/laptop/alice\n"
	tests := []struct {
		name    string
		content string
		want    int
		errHas  string
	}{
		{name: "empty file", content: "", want: 0},
		{name: "comments only", content: "# nothing yet\n\n", want: 0},
		{name: "one token", content: good, want: 1},
		{name: "one field", content: good + tokVM + "\n", errHas: "line 2: want token,spiffe-id, got 1 fields"},
		{name: "unknown third field", content: tokVM + ",spiffe://example.org/a,extra\n", errHas: "line 1: field 3 is neither reusable nor expires=<RFC 3339 time>"},
		{name: "reusable", content: tokVM + ",spiffe://example.org/a,reusable\n", want: 1},
		{name: "expiry", content: tokVM + ",spiffe://example.org/a,expires=2026-12-01T10:00:00Z\n", want: 1},
		{name: "expiry with offset, then reusable, spaced", content: tokVM + " , spiffe://example.org/a , expires=2026-12-01T11:00:00+01:00 ,\treusable \r\n", want: 1},
		{name: "reusable before expiry", content: tokVM + ",spiffe://example.org/a,reusable,expires=2026-12-01T10:00:00Z\n", want: 1},
		{name: "reusable twice", content: tokVM + ",spiffe://example.org/a,reusable,reusable\n", errHas: "line 1: field 4 repeats reusable"},
		{name: "expiry twice", content: tokVM + ",spiffe://example.org/a,expires=2026-12-01T10:00:00Z,expires=2027-12-01T10:00:00Z\n", errHas: "line 1: field 4 repeats expires"},
		{name: "expiry not RFC 3339", content: tokVM + ",spiffe://example.org/a,expires=2026-12-01\n", errHas: "line 1: field 3: expires= wants an RFC 3339 time"},
		{name: "token as expiry", content: tokVM + ",spiffe://example.org/a,expires=" + tokVM2 + "\n", errHas: "line 1: field 3: expires= wants an RFC 3339 time"},
		{name: "token as third field", content: tokVM + ",spiffe://example.org/a," + tokVM2 + "\n", errHas: "line 1: field 3 is neither"},
		{name: "marker in capitals", content: tokVM + ",spiffe://example.org/a,REUSABLE\n", errHas: "line 1: field 3 is neither"},
		{name: "trailing comma", content: tokVM + ",spiffe://example.org/a,\n", errHas: "line 1: field 3 is empty"},
		{name: "short token", content: "# c\nshort-token-15c,spiffe://example.org/a\n", errHas: "line 2: token is 15 bytes, want at least 16"},
		{name: "long token", content: strings.Repeat("a", MaxBootstrapTokenLen+1) + ",spiffe://example.org/a\n", errHas: "want at most"},
		{name: "token with space", content: "token with spaces 0123,spiffe://example.org/a\n", errHas: "b64token"},
		{name: "token with colon", content: "token:0123456789abcdef,spiffe://example.org/a\n", errHas: "b64token"},
		{name: "JWT as token", content: makeJWT(t, map[string]any{"sub": "x"}) + ",spiffe://example.org/a\n", errHas: "shape of a JWT"},
		{name: "fields swapped", content: "spiffe://example.org/a," + tokVM + "\n", errHas: "line 1: token"},
		{name: "ID not a SPIFFE ID", content: tokVM + ",https://example.org/a\n", errHas: "line 1: second field is not a SPIFFE ID"},
		{name: "ID in another trust domain", content: tokVM + ",spiffe://other.org/a\n", errHas: "line 1: spiffe://other.org/a is not in trust domain example.org"},
		{name: "ID without path", content: tokVM + ",spiffe://example.org\n", errHas: "line 1: spiffe://example.org has no path"},
		{name: "duplicate token", content: good + tokVM + ",spiffe://example.org/b\n" + tokLaptop + ",spiffe://example.org/c\n", errHas: "line 3: token repeats the one on line 1"},
		{name: "duplicate token with other spacing", content: good + " " + tokLaptop + " ,spiffe://example.org/c\n", errHas: "line 2: token repeats the one on line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := parseBootstrapTokens([]byte(tt.content), localTD)
			if tt.errHas != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.errHas)
				for _, tok := range []string{tokLaptop, tokVM, tokVM2} {
					assert.NotContains(t, err.Error(), tok, "error echoes a token")
				}
				return
			}
			require.NoError(t, err)
			assert.Len(t, set.entries, tt.want)
		})
	}
}

func TestLoadBootstrapTokensFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.csv")
	writeTokens(t, good, tokLaptop+",spiffe://example.org/laptop/alice\n", 0o600)
	readable := filepath.Join(dir, "readable.csv")
	writeTokens(t, readable, tokLaptop+",spiffe://example.org/laptop/alice\n", 0o644)
	big := filepath.Join(dir, "big.csv")
	writeTokens(t, big, strings.Repeat("#", MaxBootstrapFileSize+1), 0o600)
	bad := filepath.Join(dir, "bad.csv")
	writeTokens(t, bad, "\n\n"+tokLaptop+",spiffe://other.org/x\n", 0o600)

	t.Run("group and world readable warns", func(t *testing.T) {
		b, err := LoadBootstrapTokens(readable, localTD)
		require.NoError(t, err)
		require.Len(t, b.Warnings(), 1)
		assert.Contains(t, b.Warnings()[0], "0644")
	})
	t.Run("0600 does not warn", func(t *testing.T) {
		b, err := LoadBootstrapTokens(good, localTD)
		require.NoError(t, err)
		assert.Empty(t, b.Warnings())
	})
	for _, tt := range []struct {
		name, path, errHas string
		td                 spiffeid.TrustDomain
	}{
		{name: "missing", path: filepath.Join(dir, "missing.csv"), errHas: "no such file"},
		{name: "directory", path: dir, errHas: "not a regular file"},
		{name: "too big", path: big, errHas: "larger than"},
		{name: "bad line", path: bad, errHas: "bad.csv: line 3:"},
		{name: "no path", errHas: "path is required"},
		{name: "no trust domain", path: good, td: spiffeid.TrustDomain{}, errHas: "trust domain is required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			td := localTD
			if tt.name == "no trust domain" {
				td = tt.td
			}
			_, err := LoadBootstrapTokens(tt.path, td)
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "authn: bootstrap tokens"), err.Error())
			assert.Contains(t, err.Error(), tt.errHas)
			assert.NotContains(t, err.Error(), tokLaptop)
		})
	}
}

// TestBootstrapTokensReload shows a good change takes effect, and a bad one
// keeps the last good tokens while Err and the metric report it.
func TestBootstrapTokensReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.csv")
	writeTokens(t, path, tokLaptop+",spiffe://example.org/laptop/alice\n", 0o600)
	reg := prometheus.NewRegistry()
	b, err := NewBootstrapTokens(BootstrapTokensConfig{Path: path, TrustDomain: localTD, Registerer: reg})
	require.NoError(t, err)
	ctx := context.Background()

	// Rotate: laptop revoked, VM added.
	writeTokens(t, path, tokVM+",spiffe://example.org/vm/build\n", 0o600)
	require.NoError(t, b.Reload())
	_, err = b.Authenticate(ctx, Request{BearerToken: tokLaptop})
	require.ErrorIs(t, err, ErrInvalidCredentials)
	id, err := b.Authenticate(ctx, Request{BearerToken: tokVM})
	require.NoError(t, err)
	assert.Equal(t, vmID, id.ID)

	// A broken edit: the VM token stays in force, the error is visible.
	writeTokens(t, path, tokVM+",spiffe://example.org/vm/build\nshort,spiffe://example.org/x\n", 0o600)
	err = b.Reload()
	require.ErrorContains(t, err, "line 2")
	assert.Equal(t, err, b.Err())
	_, err = b.Authenticate(ctx, Request{BearerToken: tokVM})
	require.NoError(t, err)
	assert.Equal(t, 1.0, testutil.ToFloat64(b.m.reloads.WithLabelValues("error")))

	// Deleted file: same.
	require.NoError(t, os.Remove(path))
	require.Error(t, b.Reload())
	_, err = b.Authenticate(ctx, Request{BearerToken: tokVM})
	require.NoError(t, err)

	// Fixed, and now group-readable: loads, warns, error cleared.
	writeTokens(t, path, tokVM2+",spiffe://example.org/vm/build\n", 0o640)
	require.NoError(t, b.Reload())
	require.NoError(t, b.Err())
	assert.Len(t, b.Warnings(), 1)
	_, err = b.Authenticate(ctx, Request{BearerToken: tokVM2})
	require.NoError(t, err)
	_, err = b.Authenticate(ctx, Request{BearerToken: tokVM})
	require.ErrorIs(t, err, ErrInvalidCredentials)

	// Mode fixed without a content change: the warning goes.
	require.NoError(t, os.Chmod(path, 0o600))
	require.NoError(t, b.Reload())
	assert.Empty(t, b.Warnings())
	assert.Equal(t, 1.0, testutil.ToFloat64(collector(t, reg, "trustbridge_authn_bootstrap_tokens")))
}

func TestBootstrapTokensRun(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	path := filepath.Join(t.TempDir(), "tokens.csv")
	writeTokens(t, path, tokLaptop+",spiffe://example.org/laptop/alice\n", 0o600)
	clk := clocktesting.NewFakeClock(epoch)
	type result struct {
		changed bool
		err     error
	}
	reloads := make(chan result, 1)
	b, err := NewBootstrapTokens(BootstrapTokensConfig{
		Path: path, TrustDomain: localTD, Clock: clk, ReloadInterval: time.Minute,
		OnReload: func(changed bool, err error) { reloads <- result{changed, err} },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()

	tick := func() result {
		t.Helper()
		require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond)
		clk.Step(time.Minute)
		return <-reloads
	}

	assert.Equal(t, result{}, tick(), "unchanged file")

	writeTokens(t, path, tokVM+",spiffe://example.org/vm/build\n", 0o600)
	assert.Equal(t, result{changed: true}, tick())
	_, err = b.Authenticate(ctx, Request{BearerToken: tokVM})
	require.NoError(t, err)

	writeTokens(t, path, "garbage\n", 0o600)
	r := tick()
	require.Error(t, r.err)
	assert.False(t, r.changed)
	_, err = b.Authenticate(ctx, Request{BearerToken: tokVM})
	require.NoError(t, err, "last good tokens kept")

	cancel()
	require.NoError(t, <-done)
}
