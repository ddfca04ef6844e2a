package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// token list shows a running server's tokens by reference, never the
// tokens, with what its ledger says was consumed; token revoke removes
// one and the server stops taking it at once (reloaded over the admin
// socket), or says when it could not be told.
func TestTokenListAndRevoke(t *testing.T) {
	tokB, tokC := "reusable-bootstrap-token-b-0123456789", "expired-bootstrap-token-c-0123456789"
	lines := servertest.LaptopToken + "," + servertest.LaptopID.String() + "\n" +
		"# a reusable lab token\n" + tokB + ",spiffe://example.org/vm/b,reusable\n" +
		tokC + ",spiffe://example.org/vm/c,expires=2020-01-01T00:00:00Z\n"
	file := servertest.WriteFile(t, lines, 0o600)
	addr, rootCert, dataDir := grpcServerWithTokens(t, "", func(o *server.Config) {
		o.GRPC.BootstrapFile, o.AdminSocket = file, server.AdminSocketAuto
	})
	refA, refB := authn.TokenLine{Token: servertest.LaptopToken}.Ref(), authn.TokenLine{Token: tokB}.Ref()

	laptop := servertest.WriteFile(t, servertest.LaptopToken+"\n", 0o600)
	mustCLI(t, "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", laptop, "--credentials-dir", filepath.Join(t.TempDir(), "a"))

	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "token", "list", "--file", file, "--data-dir", dataDir, "-o", "json")), &list))
	require.Len(t, list, 3)
	assert.Equal(t, []any{refA, "consumed", "single-use"}, []any{list[0]["reference"], list[0]["state"], list[0]["use"]})
	assert.NotNil(t, list[0]["consumed_at"])
	assert.Equal(t, []any{refB, "usable", "reusable", float64(3)}, []any{list[1]["reference"], list[1]["state"], list[1]["use"], list[1]["line"]})
	assert.Equal(t, []any{"spiffe://example.org/vm/c", "expired", "2020-01-01T00:00:00Z"}, []any{list[2]["spiffe_id"], list[2]["state"], list[2]["expires"]})
	table := mustCLI(t, "token", "list", "--file", file, "--data-dir", dataDir)
	assert.Contains(t, table, "REFERENCE")
	assert.Regexp(t, refB+" +spiffe://example.org/vm/b", table)
	for _, tok := range []string{servertest.LaptopToken, tokB, tokC} {
		assert.NotContains(t, table, tok, "a token is never printed")
	}
	_, stderr, code := runCLIAt(t, time.Now, "", "token", "list", "--file", file, "--data-dir", filepath.Join(t.TempDir(), "none"))
	assert.Equal(t, 0, code)
	assert.Contains(t, stderr, "consumption unknown")

	b := servertest.WriteFile(t, tokB+"\n", 0o600)
	mustCLI(t, "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", b, "--credentials-dir", filepath.Join(t.TempDir(), "b"))
	out := mustCLI(t, "token", "revoke", refB[:10], "--file", file, "--data-dir", dataDir)
	assert.Contains(t, out, "revoked "+refB+" (spiffe://example.org/vm/b, line 3 of "+file+")")
	assert.Contains(t, out, "the server reloaded the token file")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", b, "--credentials-dir", filepath.Join(t.TempDir(), "b2"))
	assert.Equal(t, 1, code, "refused at once, without waiting for the poll")
	assert.Contains(t, stderr, "did not accept the credentials")
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Contains(t, string(data), "# a reusable lab token\n"+tokC)

	refC := authn.TokenLine{Token: tokC}.Ref()
	_, stderr, code = runCLIAt(t, time.Now, "", "token", "revoke", refC, "--file", file, "--admin", "http://"+servertest.ReservePort(t), "--data-dir", dataDir)
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "the server was not told to reload the file")
	assert.Equal(t, 1, strings.Count(mustCLI(t, "token", "list", "--file", file, "--data-dir", dataDir), "spiffe://"))
}

// token list's table is a cli.Table: wide, name (the references token
// revoke takes), --no-headers and jsonpath work, with its columns.
func TestTokenListFormats(t *testing.T) {
	tokA, tokB := "single-use-bootstrap-token-a-0123456789", "reusable-bootstrap-token-b-0123456789"
	file := servertest.WriteFile(t, tokA+",spiffe://example.org/vm/a,expires=2099-01-01T00:00:00Z\n"+tokB+",spiffe://example.org/vm/b,reusable\n", 0o600)
	refA, refB := authn.TokenLine{Token: tokA}.Ref(), authn.TokenLine{Token: tokB}.Ref()
	list := func(args ...string) string {
		return mustCLI(t, append([]string{"token", "list", "--file", file, "--data-dir", t.TempDir()}, args...)...)
	}
	table := list()
	assert.Regexp(t, `^REFERENCE +SPIFFE ID +USE +EXPIRES +STATE\n`+refA+` +spiffe://example.org/vm/a +single-use +2099-01-01T00:00:00Z +usable\n`+
		refB+` +spiffe://example.org/vm/b +reusable +never +usable\n$`, table)
	assert.Equal(t, table, list("-o", "wide"))
	assert.Equal(t, refA+"\n"+refB+"\n", list("-o", "name"))
	assert.Regexp(t, `^`+refA+` +spiffe://example.org/vm/a +single-use +\S+ +usable\n`+refB+` `, list("--no-headers"))
	assert.Equal(t, "spiffe://example.org/vm/a spiffe://example.org/vm/b", list("-o", "jsonpath={.[*].spiffe_id}"))
}

// token revoke says plainly when the server has no token file loaded
// (its reload route is not mounted: "404 page not found"), and fails when
// the server answers that the file does not load: the revoked token is
// then still accepted.
func TestTokenRevokeReloadAnswers(t *testing.T) {
	for _, tt := range []struct {
		name    string
		handler http.HandlerFunc
		code    int
		stderr  string
	}{
		{"no token file", http.NotFound, 0, "has no bootstrap token file loaded (no --bootstrap-token-file), so there was nothing to reload"},
		{"reload failed", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "--bootstrap-token-file: open /etc/tokens: permission denied; the tokens loaded before stay in force", http.StatusUnprocessableEntity)
		}, 1, "permission denied; the tokens loaded before stay in force; token "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.Handle("POST /v1/bootstrap-tokens/reload", tt.handler)
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			tok := "single-use-bootstrap-token-a-0123456789"
			file := servertest.WriteFile(t, tok+",spiffe://example.org/vm/a\n", 0o600)
			adminTok := servertest.WriteFile(t, "admin-token\n", 0o600)
			ref := authn.TokenLine{Token: tok}.Ref()
			stdout, stderr, code := runCLIAt(t, time.Now, "", "token", "revoke", ref, "--file", file, "--admin", srv.URL, "--admin-token-file", adminTok)
			assert.Equal(t, tt.code, code, stderr)
			assert.Contains(t, stdout, "revoked "+ref)
			assert.Contains(t, stderr, tt.stderr)
			assert.NotContains(t, stderr, "404 page not found")
			if tt.code != 0 {
				assert.Contains(t, stderr, ref+" is STILL accepted until the file is readable by the server, valid, and reloaded")
			}
		})
	}
}
