package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	bundlecmd "github.com/trustbridge/trustbridge/cmd/trustbridge/cli/bundle"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/ and the generated part of docs/configuration.md")

// fixedNow keeps "expired" annotations in goldens stable.
var fixedNow = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

// runCLI runs the CLI as main does, with a fixed clock.
func runCLI(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runCLIAt(t, func() time.Time { return fixedNow }, stdin, args...)
}

// runCLIAt runs the CLI with the given clock.
func runCLIAt(t *testing.T, now func() time.Time, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, cli.Env{In: strings.NewReader(stdin), Out: &out, Err: &errb, Now: now})
	return out.String(), errb.String(), code
}

func b64DER(der []byte) string { return base64.StdEncoding.EncodeToString(der) }

func repoTestdata(parts ...string) string {
	return filepath.Join(append([]string{"..", "..", "testdata"}, parts...)...)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./cmd/trustbridge -update")
	assert.Equal(t, string(want), got)
}

// Every bundle file under testdata/ inspects cleanly, in every format
// that applies to it.
func TestInspectEveryTestdataFile(t *testing.T) {
	var files []string
	require.NoError(t, filepath.WalkDir(repoTestdata(), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".json") {
			files = append(files, p)
		}
		return err
	}))
	require.NotEmpty(t, files)
	for _, f := range files {
		// Each for the trust domain it belongs to, as the poller of that
		// trust domain's endpoint would see it.
		var args []string
		for _, gc := range goldenCases {
			if gc.file == filepath.Base(f) {
				args = gc.args()
			}
		}
		for _, format := range []string{"table", "json", "yaml", "spiffe"} {
			_, stderr, code := runCLI(t, "", append(append([]string{"bundle", "inspect", "-o", format}, args...), f)...)
			assert.Equal(t, 0, code, "%s -o %s: %s", f, format, stderr)
		}
	}
}

type goldenCase struct {
	file, td string
	extra    []string
}

// args are the inspect flags the case is inspected with.
func (gc goldenCase) args() []string {
	var args []string
	if gc.td != "" {
		args = append(args, "--trust-domain", gc.td)
	}
	return append(args, gc.extra...)
}

var goldenCases = []goldenCase{
	{file: "spire.json", td: "example.org"},
	{file: "istio.json", td: "cluster.local"},
	{file: "pq-akp.json", td: "pq.example"},
	{file: "tolerant.json", td: "example.org"},
	// keys: [] revokes every key: the poller takes it only with
	// --federation-allow-empty.
	{file: "revoked.json", extra: []string{"--allow-empty"}},
	{file: "bundle-map.json"},
}

func TestInspectGolden(t *testing.T) {
	for _, gc := range goldenCases {
		for _, format := range []string{"table", "json"} {
			t.Run(gc.file+"/"+format, func(t *testing.T) {
				args := append([]string{"bundle", "inspect", "-o", format}, gc.args()...)
				path := repoTestdata("bundles", gc.file)
				stdout, stderr, code := runCLI(t, "", append(args, path)...)
				require.Equal(t, 0, code, stderr)
				// The source path differs by working directory; normalize it.
				stdout = strings.ReplaceAll(stdout, path, "testdata/bundles/"+gc.file)
				golden(t, filepath.Join("inspect", strings.TrimSuffix(gc.file, ".json")+"."+format+".golden"), stdout)
			})
		}
	}
}

func TestInspectJSONIsMachineReadable(t *testing.T) {
	stdout, _, code := runCLI(t, "", "bundle", "inspect", "-o", "json", "-t", "pq.example", repoTestdata("bundles", "pq-akp.json"))
	require.Equal(t, 0, code)
	var got bundlecmd.Inspection
	require.NoError(t, json.Unmarshal([]byte(stdout), &got))
	require.Len(t, got.Bundles, 1)
	assert.Equal(t, "pq.example", got.Bundles[0].TrustDomain)
	assert.Equal(t, uint64(3), *got.Bundles[0].Sequence)
	assert.Equal(t, int64(600), *got.Bundles[0].RefreshHintSeconds)
	require.Len(t, got.Bundles[0].Authorities, 2)
	assert.Equal(t, "EC", got.Bundles[0].Authorities[0].KeyType)
	assert.Equal(t, "P-384", got.Bundles[0].Authorities[0].Curve)
	assert.Equal(t, 384, got.Bundles[0].Authorities[0].KeySize)
	assert.Len(t, got.Bundles[0].Authorities[0].SHA256, 64)
	require.Len(t, got.Warnings, 1)
	assert.Equal(t, "unknown_kty", got.Warnings[0].Code)
}

func TestInspectPEM(t *testing.T) {
	stdout, stderr, code := runCLI(t, "", "bundle", "inspect", "-o", "pem", "-t", "example.org", repoTestdata("bundles", "spire.json"))
	require.Equal(t, 0, code, stderr)
	var n int
	for rest := []byte(stdout); ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		assert.Equal(t, "CERTIFICATE", block.Type)
	}
	assert.Equal(t, 2, n)
	assert.Contains(t, stderr, "2 JWT/WIT authorities have no certificate")

	t.Run("bundle map needs one trust domain", func(t *testing.T) {
		_, stderr, code := runCLI(t, "", "bundle", "inspect", "-o", "pem", repoTestdata("bundles", "bundle-map.json"))
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "holds 2 trust domains; PEM cannot say which root belongs to which")
	})
	t.Run("bundle map entry", func(t *testing.T) {
		stdout, _, code := runCLI(t, "", "bundle", "inspect", "-o", "pem", "-t", "west.example", repoTestdata("bundles", "bundle-map.json"))
		assert.Equal(t, 0, code)
		assert.Equal(t, 1, strings.Count(stdout, "BEGIN CERTIFICATE"))
	})
}

func TestInspectSPIFFEFormatIsCanonical(t *testing.T) {
	for _, gc := range goldenCases {
		t.Run(gc.file, func(t *testing.T) {
			args := append([]string{"bundle", "inspect", "-o", "spiffe"}, gc.args()...)
			stdout, _, code := runCLI(t, "", append(args, repoTestdata("bundles", gc.file))...)
			require.Equal(t, 0, code)
			want, err := os.ReadFile(repoTestdata("bundles", "canonical", gc.file))
			require.NoError(t, err)
			assert.Equal(t, string(want)+"\n", stdout)
		})
	}
}

func TestInspectStdinAndWarningsOnStderr(t *testing.T) {
	data, err := os.ReadFile(repoTestdata("bundles", "tolerant.json"))
	require.NoError(t, err)
	stdout, stderr, code := runCLI(t, string(data), "bundle", "inspect", "-o", "spiffe", "-t", "example.org", "-")
	require.Equal(t, 0, code)
	assert.True(t, strings.HasPrefix(stdout, `{"keys":[`), "stdout stays a clean document")
	assert.Contains(t, stderr, `warning: keys[1]: use "foo-svid" is not supported; element ignored`)
}

// A root naming another trust domain was a warning here while the poller
// refused the document; now it is the poller's refusal (issue 21 item 6).
func TestInspectForeignTrustDomainRefused(t *testing.T) {
	// With the wrong trust domain, the roots' SPIFFE IDs give it away.
	stdout, stderr, code := runCLI(t, "", "bundle", "inspect", "-t", "other.org", repoTestdata("bundles", "pq-akp.json"))
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, `bundle is for another trust domain: keys[0]: x5c certificate names trust domain "pq.example" but the bundle is for "other.org"`)
	// Without one, no endpoint but pq.example's could serve it.
	stdout, stderr, code = runCLI(t, "", "bundle", "inspect", repoTestdata("bundles", "pq-akp.json"))
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, `its x5c certificates name pq.example: the poller refuses it (bundle is for another trust domain) from the endpoint of any other; pass --trust-domain pq.example`)
	assert.NotContains(t, stderr, bundlecmd.UnnamedTD.Name(), "the placeholder is not the user's business")
}

func TestInspectEscapesControlCharacters(t *testing.T) {
	key := testca.NewKey(t, testca.ECP256).Public()
	b := spiffebundle.New(spiffeid.RequireTrustDomainFromString("example.org"))
	require.NoError(t, b.AddJWTAuthority("kid\x1b[2J\nfake-row", key))
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	stdout, _, code := runCLI(t, string(doc), "bundle", "inspect", "-t", "example.org", "-")
	require.Equal(t, 0, code)
	assert.NotContains(t, stdout, "\x1b")
	assert.Contains(t, stdout, `kid kid\x1b[2J\nfake-row`)
}

func TestInspectRealTrustDomainNamedLikeThePlaceholder(t *testing.T) {
	stdout, _, code := runCLI(t, `{"keys":[]}`, "bundle", "inspect", "-o", "json", "--allow-empty", "-t", bundlecmd.UnnamedTD.Name(), "-")
	require.Equal(t, 0, code)
	assert.Contains(t, stdout, `"trust_domain": "unnamed.invalid"`)
}

func TestInspectExpiredAuthority(t *testing.T) {
	ca := testca.New(t, "example.org", testca.Options{
		NotBefore: fixedNow.Add(-48 * time.Hour), NotAfter: fixedNow.Add(-time.Hour),
	})
	doc, err := bundledoc.Marshal(ca.Bundle())
	require.NoError(t, err)
	stdout, _, code := runCLI(t, string(doc), "bundle", "inspect", "-t", "example.org", "-")
	require.Equal(t, 0, code)
	assert.Contains(t, stdout, "(EXPIRED)")
}

func TestInspectErrors(t *testing.T) {
	ca := testca.New(t, "example.org")
	leaf, _ := ca.Issue(t, spiffeid.RequireFromString("spiffe://example.org/w"))
	bad, err := json.Marshal(map[string]any{"keys": []any{map[string]any{
		"kty": "EC", "use": "x509-svid", "crv": "P-256", "x5c": []string{b64DER(leaf.Raw)},
		"x": "AAAA", "y": "AAAA",
	}}})
	require.NoError(t, err)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing keys", []string{write("a.json", `{"spiffe_sequence":1}`)}, `a.json: federation: invalid bundle document: bundledoc: missing "keys"`},
		{"trailing data", []string{write("b.json", `{"keys":[]} {}`)}, "unexpected data after the JSON document"},
		{"bad element", []string{write("c.json", string(bad))}, "bundledoc: keys[0]: invalid JWK"},
		{"no such file", []string{filepath.Join(dir, "nope.json")}, "no such file or directory"},
		{"too large", []string{"--max-size", "10", write("d.json", `{"keys":[],"x":"0123456789"}`)}, "document too large: more than 10 bytes"},
		{"bad trust domain", []string{"-t", "example.org:443", write("e.json", `{"keys":[]}`)}, `--trust-domain "example.org:443": must be a trust domain such as example.org or spiffe://example.org, without another scheme, port or path`},
		{"a SPIFFE ID for a trust domain", []string{"-t", "spiffe://example.org/w", write("e.json", `{"keys":[]}`)}, `--trust-domain "spiffe://example.org/w": is a SPIFFE ID with a path`},
		{"unknown format", []string{"-o", "xml", write("f.json", `{"keys":[]}`)}, `-o "xml": want table, wide, name, json, yaml, pem, spiffe or jsonpath=TEMPLATE`},
		{"map without that trust domain", []string{"-t", "nope.example", repoTestdata("bundles", "bundle-map.json")}, `bundle map has no trust domain "nope.example"`},
		{"no file", []string{}, "accepts 1 arg(s), received 0"},
		{"non-positive max size", []string{"--max-size", "0", write("g.json", `{"keys":[]}`)}, "--max-size must be positive"},
		{"pem of an empty map", []string{"-o", "pem", write("h.json", `{"trust_domains":{}}`)}, "is an empty bundle map"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runCLI(t, "", append([]string{"bundle", "inspect"}, tt.args...)...)
			assert.Equal(t, 1, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tt.want)
		})
	}
}

func TestRunExitStatus(t *testing.T) {
	stdout, _, code := runCLI(t, "", "version")
	assert.Equal(t, 0, code)
	assert.True(t, strings.HasPrefix(stdout, "trustbridge "))
	_, stderr, code := runCLI(t, "", "bundle", "inspect", "/nonexistent/x.json")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "trustbridge: open /nonexistent/x.json")
	_, stderr, code = runCLI(t, "", "no-such-command")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `unknown command "no-such-command"`)
}

// inspect runs the poller's verdict (federation.CheckDocument): exit 1,
// with the poller's reason, exactly where the poller refuses (issue 21
// item 6).
func TestInspectSharesThePollersVerdict(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b *spiffebundle.Bundle, seq uint64) string {
		c := b.Clone()
		c.SetSequenceNumber(seq)
		doc, err := bundledoc.Marshal(c)
		require.NoError(t, err)
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, doc, 0o600))
		return p
	}
	ca := testca.New(t, "example.org")
	other := testca.New(t, "example.org")
	held := write("held.json", ca.Bundle(), 7)
	foreign := testca.New(t, "other.org")
	foreignMap, err := bundledoc.MarshalMap([]*spiffebundle.Bundle{ca.Bundle(), spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("west.example"), foreign.Bundle().X509Authorities())})
	require.NoError(t, err)
	tolerant := repoTestdata("bundles", "tolerant.json")
	revoked := repoTestdata("bundles", "revoked.json")
	tests := []struct {
		name string
		args []string
		want string // "" means exit 0
	}{
		{"tolerant.json for its trust domain", []string{"-t", "example.org", tolerant}, ""},
		{"tolerant.json without a trust domain", []string{tolerant}, `its x5c certificates name example.org: the poller refuses it (bundle is for another trust domain) from the endpoint of any other; pass --trust-domain example.org`},
		{"tolerant.json for another trust domain", []string{"-t", "peer.example", tolerant}, `federation: bundle is for another trust domain: keys[0]: x5c certificate names trust domain "example.org" but the bundle is for "peer.example"`},
		{"keys: []", []string{revoked}, "federation: accept: bundle has no X.509 or JWT authorities"},
		{"keys: [] with --allow-empty", []string{"--allow-empty", revoked}, ""},
		{"sequence going back", []string{"-t", "example.org", "--held", held, write("old.json", ca.Bundle(), 6)}, "spiffe_sequence regressed: fetched 6, held 7"},
		{"other keys under the same sequence", []string{"-t", "example.org", "--held", held, write("same.json", other.Bundle(), 7)}, "same spiffe_sequence with different authorities"},
		{"next sequence", []string{"-t", "example.org", "--held", held, write("next.json", other.Bundle(), 8)}, ""},
		{"--held needs a trust domain", []string{"--held", held, tolerant}, "--held needs --trust-domain"},
		{"--held is checked too", []string{"-t", "peer.example", "--held", held, write("peer.json", ca.Bundle(), 8)}, `--held ` + held + `: federation: bundle is for another trust domain`},
		{"bundle map entry naming another trust domain", []string{writeRaw(t, dir, "map.json", foreignMap)}, `trust_domains["west.example"]: federation: bundle is for another trust domain`},
		{"the other entry of that map", []string{"-t", "example.org", filepath.Join(dir, "map.json")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runCLI(t, "", append([]string{"bundle", "inspect"}, tt.args...)...)
			if tt.want == "" {
				assert.Equal(t, 0, code, stderr)
				assert.NotEmpty(t, stdout)
				return
			}
			assert.Equal(t, 1, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tt.want)
		})
	}
}

func writeRaw(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, data, 0o600))
	return p
}

// --format, the flag -o replaced, still works and warns on stderr only.
func TestInspectFormatAlias(t *testing.T) {
	file := repoTestdata("bundles", "spire.json")
	want, _, code := runCLI(t, "", "bundle", "inspect", "-o", "json", "-t", "example.org", file)
	require.Equal(t, 0, code)
	got, stderr, code := runCLI(t, "", "bundle", "inspect", "--format", "json", "-t", "example.org", file)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, want, got, "stdout is the JSON alone")
	assert.Contains(t, stderr, "--format is deprecated and goes in a later release; use -o json")
	_, stderr, code = runCLI(t, "", "bundle", "inspect", "--format", "xml", file)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `-o "xml": want`)
}
