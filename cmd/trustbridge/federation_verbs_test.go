package main

import (
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	bundlecmd "github.com/trustbridge/trustbridge/cmd/trustbridge/cli/bundle"
	fedcmd "github.com/trustbridge/trustbridge/cmd/trustbridge/cli/federation"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// runtimeEvents are the run-time changes of dir's audit log, as "event td
// reason".
func runtimeEvents(t *testing.T, dir string, events ...string) []string {
	t.Helper()
	var out []string
	for _, e := range servertest.ReadAuditLog(t, dir) {
		for _, want := range events {
			if e.Event == want {
				out = append(out, e.Event+" "+e.TrustDomain+" "+e.Reason)
			}
		}
	}
	return out
}

// federation show and update against a running server (issue 36, item
// 7): update changes only what it is given, add --force no longer turns
// an https_spiffe peer into https_web, a trust domain is taken as
// spiffe://td too, and peers configured in a file are changed there.
func TestFederationShowAndUpdate(t *testing.T) {
	peerDir := t.TempDir()
	peer := startE2EServer(t, "peer.example", peerDir, nil)
	peerPEM := writeTemp(t, mustCLI(t, "bundle", "show", "-o", "pem", "--data-dir", peerDir))
	fedFile := writeTemp(t, servertest.WebPeers("file.example"))
	dir := t.TempDir()
	local := startE2EServer(t, "example.org", dir, func(o *server.Config) { o.Federation.ConfigFile = fedFile })
	run := func(args ...string) (string, string, int) {
		return runCLIAt(t, time.Now, "", append(args, "--admin", local.admin, "--data-dir", dir)...)
	}
	const endpointID = "spiffe://peer.example/trustbridge/bundle-endpoint"
	mustCLI(t, "federation", "add", "spiffe://peer.example", peer.bundleURL, "--endpoint-spiffe-id", endpointID, "--bundle", peerPEM, "--admin", local.admin, "--data-dir", dir)
	waitFederated(t, local, "peer.example", 0, 30*time.Second)

	var shown fedcmd.Peer
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "federation", "show", "spiffe://peer.example", "-o", "json", "--admin", local.admin)), &shown))
	assert.Equal(t, []string{"peer.example", server.OriginRuntime, peer.bundleURL, "https_spiffe", endpointID, "ok"},
		[]string{shown.TrustDomain, shown.Origin, shown.EndpointURL, shown.Profile, shown.EndpointSPIFFEID, shown.State})
	require.NotNil(t, shown.Sequence)
	require.NotEmpty(t, shown.Authorities)
	assert.NotNil(t, shown.Authorities[0].NotAfter, "each root with its expiry")
	table := mustCLI(t, "federation", "show", "peer.example", "--admin", local.admin)
	for _, want := range []string{"Trust domain:        peer.example\n", "Origin:              runtime\n", "Endpoint SPIFFE ID:  " + endpointID + "\n",
		"State:               OK\n", "Last error:          -\n", "\nKIND  SUBJECT / KEY ID", "\nx509  ", "\njwt   kid "} {
		assert.Contains(t, table, want)
	}
	assert.Contains(t, mustCLI(t, "federation", "show", "file.example", "-o", "yaml", "--admin", local.admin), "origin: file\n")

	// add --force without --endpoint-spiffe-id is refused, not a silent
	// switch to https_web.
	_, stderr, code := run("federation", "add", "peer.example", peer.bundleURL, "--force")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "409 Conflict: trust domain already federated: peer.example is federated by https_spiffe (endpoint SPIFFE ID "+endpointID+"), and the replacement is https_web: "+
		"pass --endpoint-spiffe-id to keep https_spiffe, or change only what you give with trustbridge federation update (--profile https_web to switch on purpose)")
	assert.Equal(t, "https_spiffe", relationships(t, local)["peer.example"].Profile)

	// update changes the URL only: the profile, ID and bootstrap bundle stay.
	down := "https://" + servertest.ReservePort(t) + "/"
	stdout, stderr, code := run("federation", "update", "peer.example", "--endpoint-url", down, "--no-fetch")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "updated peer.example: federated by peer.example|"+down+"|"+endpointID+"\n", stdout)
	assert.Equal(t, api.Relationship{TrustDomain: "peer.example", Origin: server.OriginRuntime, EndpointURL: down, Profile: "https_spiffe", EndpointSPIFFEID: endpointID, State: relationships(t, local)["peer.example"].State},
		relationships(t, local)["peer.example"])
	// Without --no-fetch the new endpoint must answer.
	_, stderr, code = run("federation", "update", "peer.example", "--endpoint-spiffe-id", "spiffe://peer.example/other")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "502 Bad Gateway: first fetch failed")
	assert.Equal(t, endpointID, relationships(t, local)["peer.example"].EndpointSPIFFEID, "nothing changed")
	mustCLI(t, "federation", "update", "spiffe://peer.example", "--endpoint-url", peer.bundleURL, "--admin", local.admin, "--data-dir", dir)
	assert.Equal(t, peer.bundleURL, relationships(t, local)["peer.example"].EndpointURL)

	tests := []struct {
		name string
		args []string
		msg  string
	}{
		{"nothing", []string{"peer.example"}, "trustbridge: nothing to update: give at least one of --endpoint-url, --endpoint-spiffe-id, --profile, --bundle\n"},
		{"bad profile", []string{"peer.example", "--profile", "web"}, `trustbridge: --profile "web": want https_web or https_spiffe` + "\n"},
		{"web with an ID", []string{"peer.example", "--profile", "https_web", "--endpoint-spiffe-id", endpointID},
			"trustbridge: --profile https_web authenticates the endpoint by Web PKI, without an endpoint SPIFFE ID: give --profile https_web or --endpoint-spiffe-id, not both\n"},
		{"bad trust domain", []string{"spiffe://peer.example/x", "--endpoint-url", down}, `trustbridge: trust domain "spiffe://peer.example/x": is a SPIFFE ID with a path; a trust domain is written example.org or spiffe://example.org` + "\n"},
		{"bundle of another trust domain", []string{"peer.example", "--bundle", writeTemp(t, string(testca.PEM(testca.New(t, "other.example").Cert)))}, "bundle is for another trust domain"},
		{"unknown", []string{"nope.example", "--endpoint-url", down}, "404 Not Found: trust domain not managed: nope.example has no endpoint added at run time (see trustbridge federation list); add it with trustbridge federation add"},
		{"configured in a file", []string{"file.example", "--endpoint-url", down}, "409 Conflict: trust domain configured elsewhere: file.example is configured by --federation-config (or the --config file's federation list); change it there"},
		{"http URL", []string{"peer.example", "--endpoint-url", "http://peer.example/", "--no-fetch"}, `400 Bad Request: invalid change: endpoint_url "http://peer.example/": scheme must be https`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, code := run(append([]string{"federation", "update"}, tt.args...)...)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, tt.msg)
			assert.Equal(t, peer.bundleURL, relationships(t, local)["peer.example"].EndpointURL)
		})
	}

	for _, args := range [][]string{{"nope.example"}, {"spiffe://nope.example/x"}} {
		_, stderr, code = runCLIAt(t, time.Now, "", append([]string{"federation", "show", "--admin", local.admin}, args...)...)
		assert.Equal(t, 1, code)
		assert.Contains(t, []string{"trustbridge: nope.example is not federated (see trustbridge federation list)\n",
			`trustbridge: trust domain "spiffe://nope.example/x": is a SPIFFE ID with a path; a trust domain is written example.org or spiffe://example.org` + "\n"}, stderr)
	}
	_, stderr, code = runCLIAt(t, time.Now, "", "federation", "refresh", "spiffe://nope.example", "--admin", local.admin)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `trust domain "nope.example" is not federated`, "sent as the name")
	assert.Contains(t, mustCLI(t, "federation", "remove", "spiffe://peer.example", "--admin", local.admin, "--data-dir", dir), "removed peer.example")
	assert.Equal(t, []string{"federation_added peer.example by admin-token (admin API)",
		"federation_updated peer.example by admin-token (admin API): endpoint URL " + peer.bundleURL + " → " + down,
		"federation_updated peer.example by admin-token (admin API): endpoint URL " + down + " → " + peer.bundleURL,
		"federation_removed peer.example by admin-token (admin API)"},
		runtimeEvents(t, dir, "federation_added", "federation_updated", "federation_replaced", "federation_removed"))
}

// bundle list and bundle delete against a running server (issue 36,
// item 7): delete removes what bundle set gave, and nothing else.
func TestBundleListAndDelete(t *testing.T) {
	fedFile := writeTemp(t, servertest.WebPeers("file.example"))
	dir := t.TempDir()
	local := startE2EServer(t, "example.org", dir, func(o *server.Config) { o.Federation.ConfigFile = fedFile })
	run := func(args ...string) (string, string, int) {
		return runCLIAt(t, time.Now, "", append(args, "--admin", local.admin, "--data-dir", dir)...)
	}
	static := testca.New(t, "static.example")
	mustCLI(t, "bundle", "set", "spiffe://static.example", writeTemp(t, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: static.Cert.Raw}))), "--admin", local.admin, "--data-dir", dir)
	mustCLI(t, "federation", "add", "web.example", "https://"+servertest.ReservePort(t)+"/", "--no-fetch", "--admin", local.admin, "--data-dir", dir)

	var held []bundlecmd.Held
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, "bundle", "list", "-o", "json", "--admin", local.admin)), &held))
	require.Len(t, held, 2, "our own and the static bundle; the peers never fetched hold none")
	assert.Equal(t, []string{"example.org", "local"}, []string{held[0].TrustDomain, held[0].Origin})
	assert.NotZero(t, held[0].Authorities)
	assert.Equal(t, []string{"static.example", "static"}, []string{held[1].TrustDomain, held[1].Origin})
	assert.Equal(t, 1, held[1].Authorities)
	require.NotNil(t, held[1].EarliestExpiry)
	assert.True(t, held[1].EarliestExpiry.Equal(static.Cert.NotAfter))
	table := mustCLI(t, "bundle", "list", "--admin", local.admin)
	assert.Regexp(t, `^TRUST DOMAIN +ORIGIN +SEQ +AUTHORITIES +EARLIEST EXPIRY\nexample.org +local +[0-9]+ +2 +`, table)
	assert.Regexp(t, `\nstatic.example +static +- +1 +`+static.Cert.NotAfter.UTC().Format(time.RFC3339)+"\n$", table)

	tests := []struct {
		td, msg string
	}{
		{"web.example", "409 Conflict: trust domain already federated: web.example is federated by its endpoint web.example|"},
		{"web.example", "where its bundle comes from: stop federating with it with trustbridge federation remove"},
		{"example.org", "400 Bad Request: invalid change: example.org is this server's own trust domain; its bundle comes from our CA"},
		{"file.example", "409 Conflict: trust domain configured elsewhere: file.example is configured by --federation-config (or the --config file's federation list); change it there"},
		{"nope.example", "404 Not Found: trust domain not managed: nope.example has no bundle set at run time with bundle set (see trustbridge bundle list)"},
		{"spiffe://static.example/x", `trustbridge: trust domain "spiffe://static.example/x": is a SPIFFE ID with a path`},
	}
	for _, tt := range tests {
		_, stderr, code := run("bundle", "delete", tt.td)
		assert.Equal(t, 1, code, tt.td)
		assert.Contains(t, stderr, tt.msg)
	}
	assert.Len(t, relationships(t, local), 3, "nothing changed")

	stdout, stderr, code := run("bundle", "delete", "spiffe://static.example")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "deleted static.example's static bundle; it is no longer trusted\n", stdout)
	assert.NotContains(t, mustCLI(t, "bundle", "list", "--admin", local.admin), "static.example")
	assert.NotContains(t, relationships(t, local), "static.example")
	assert.Contains(t, relationships(t, local), "web.example")
	assert.Equal(t, []string{"static_bundle_set static.example by admin-token (admin API)", "static_bundle_removed static.example by admin-token (admin API)"},
		runtimeEvents(t, dir, "static_bundle_set", "static_bundle_removed"))

	// Kept across a restart.
	local.stop()
	local = startE2EServer(t, "example.org", dir, func(o *server.Config) { o.Federation.ConfigFile = fedFile })
	assert.NotContains(t, relationships(t, local), "static.example")
}

// bundle list and bundle delete find the server's admin socket in
// --data-dir as the other admin commands do: with --admin left out they
// work against a server whose admin listener is not the default address,
// and delete needs no token. bundle list's table is a cli.Table: wide,
// name, --no-headers and jsonpath work.
func TestBundleCommandsUseAdminSocket(t *testing.T) {
	base, err := os.MkdirTemp("", "sock")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := filepath.Join(base, "data")
	o := flagServerOptions(t, "--trust-domain", "example.org", "--data-dir", dir, "--init", "--admin-listen", "127.0.0.1:0", "--log-format", "json")
	launchServer(t, o)
	require.NoError(t, os.Remove(filepath.Join(dir, server.AdminTokenName)))
	t.Setenv("TRUSTBRIDGE_ADMIN_TOKEN_FILE", "")

	static := testca.New(t, "static.example")
	mustCLI(t, "bundle", "set", "static.example", writeTemp(t, string(testca.PEM(static.Cert))), "--data-dir", dir)
	table := mustCLI(t, "bundle", "list", "--data-dir", dir)
	assert.Regexp(t, `^TRUST DOMAIN +ORIGIN +SEQ +AUTHORITIES +EARLIEST EXPIRY\nexample.org +local +[0-9]+ +2 +`, table)
	assert.Regexp(t, `\nstatic.example +static +- +1 +`+static.Cert.NotAfter.UTC().Format(time.RFC3339)+"\n$", table)
	assert.Equal(t, table, mustCLI(t, "bundle", "list", "--data-dir", dir, "-o", "wide"), "no wide columns")
	assert.Equal(t, "example.org\nstatic.example\n", mustCLI(t, "bundle", "list", "--data-dir", dir, "-o", "name"))
	rows := mustCLI(t, "bundle", "list", "--data-dir", dir, "--no-headers")
	assert.Regexp(t, `^example.org +local +[0-9]+ +2 +\S+\nstatic.example +static +- +1 +\S+\n$`, rows)
	assert.Equal(t, "local static", mustCLI(t, "bundle", "list", "--data-dir", dir, "-o", "jsonpath={.[*].origin}"))

	stdout, stderr, code := runCLIAt(t, time.Now, "", "bundle", "delete", "static.example", "--data-dir", dir)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "deleted static.example's static bundle; it is no longer trusted\n", stdout)
	assert.Equal(t, "example.org\n", mustCLI(t, "bundle", "list", "--data-dir", dir, "-o", "name"))
	assert.Equal(t, []string{"static_bundle_set static.example by admin-socket (admin API)", "static_bundle_removed static.example by admin-socket (admin API)"},
		runtimeEvents(t, dir, "static_bundle_set", "static_bundle_removed"))
}

// bundle inspect reads PEM (SPIRE's default format), as bundle set does,
// with the trust domain it cannot name itself.
func TestInspectReadsPEM(t *testing.T) {
	ca := testca.New(t, "peer.example")
	file := filepath.Join(t.TempDir(), "bundle.pem")
	require.NoError(t, os.WriteFile(file, testca.PEM(ca.Cert), 0o600))

	stdout, stderr, code := runCLI(t, "", "bundle", "inspect", "-t", "spiffe://peer.example", file)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "Kind:    PEM CA certificates\n")
	assert.Contains(t, stdout, "Trust domain:  peer.example\n")
	assert.Contains(t, stdout, "Refresh hint:  (none in PEM)\n")

	var ins bundlecmd.Inspection
	stdout, _, code = runCLI(t, "", "bundle", "inspect", "-t", "peer.example", "-o", "json", file)
	require.Equal(t, 0, code)
	require.NoError(t, json.Unmarshal([]byte(stdout), &ins))
	assert.Equal(t, "pem", ins.Kind)
	require.Len(t, ins.Bundles, 1)
	assert.Len(t, ins.Bundles[0].Authorities, 1)

	// From standard input, converted to the SPIFFE document a peer serves.
	stdout, _, code = runCLI(t, string(testca.PEM(ca.Cert)), "bundle", "inspect", "-t", "peer.example", "-o", "spiffe", "-")
	require.Equal(t, 0, code)
	assert.True(t, strings.HasPrefix(stdout, `{"keys":[{`), stdout)
	assert.Contains(t, stdout, `"x509-svid"`)

	leaf, _ := ca.Issue(t, spiffeid.RequireFromString("spiffe://peer.example/w"))
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no trust domain", []string{file}, "trustbridge: " + file + ": PEM certificates do not name their trust domain: pass it with -t/--trust-domain, as bundle set takes it\n"},
		{"another trust domain", []string{"-t", "other.example", file}, `bundle is for another trust domain: PEM certificate 1: x5c certificate names trust domain "peer.example" but the bundle is for "other.example"`},
		{"a leaf", []string{"-t", "peer.example", writeTemp(t, string(testca.PEM(leaf)))}, "not a CA"},
		{"text before the PEM", []string{"-t", "peer.example", writeTemp(t, "Certificate:\n    Data:\n"+string(testca.PEM(ca.Cert)))}, "text before the first -----BEGIN line"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runCLI(t, "", append([]string{"bundle", "inspect"}, tt.args...)...)
			assert.Equal(t, 1, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tt.want)
		})
	}
}
