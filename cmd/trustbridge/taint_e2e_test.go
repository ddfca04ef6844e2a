package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

const westAudience = "spiffe://west.example/ns/default/sa/web"

// authorityChange runs `ca authority ACTION KIND [args]` against s and
// returns what it printed.
func authorityChange(t *testing.T, s *e2eServer, action, kind string, args ...string) string {
	t.Helper()
	return mustCLI(t, append([]string{"ca", "authority", action, kind, "--admin", s.admin, "--data-dir", s.dataDir}, args...)...)
}

// activeAuthority is s's active X.509 authority, or JWT key.
func activeAuthority(t *testing.T, s *e2eServer, jwt bool) api.CAAuthority {
	t.Helper()
	list := authorityList(t, s)
	all := list.X509
	if jwt {
		all = list.JWT
	}
	for _, a := range all {
		if a.State == "active" {
			return a
		}
	}
	t.Fatalf("%s has no active authority", s.td.Name())
	return api.CAAuthority{}
}

// handshakes runs mTLS handshakes between an east workload (server) and
// a west one (client), each with what its own agent gives it now, until
// stopped; stop returns how many ran and the failures.
func handshakes(t *testing.T, east, west *workloadapi.X509Source) (stop func() (int, []error)) {
	t.Helper()
	serverCfg := tlsconfig.MTLSServerConfig(east, east, tlsconfig.AuthorizeID(westWorkload))
	clientCfg := tlsconfig.MTLSClientConfig(west, west, tlsconfig.AuthorizeID(eastWorkload))
	done := make(chan struct{})
	var wg sync.WaitGroup
	var n int
	var failures []error
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for range 4000 { // bounded: at most a few minutes of handshakes
			select {
			case <-done:
				return
			case <-tick.C:
			}
			serr, cerr := mtls(t, serverCfg, clientCfg)
			n++
			for _, err := range []error{serr, cerr} {
				if err != nil {
					failures = append(failures, err)
				}
			}
		}
	}()
	return func() (int, []error) {
		close(done)
		wg.Wait()
		return n, failures
	}
}

// TestTaintAndRevokeE2E is issue 38's whole sequence between two trust
// domains federated over https_spiffe, with go-spiffe Workload API
// clients on real agents: east prepares and activates a new root and JWT
// key once west holds them, taints the old ones and restarts at once;
// its agents re-issue every X509-SVID and JWT-SVID from the new ones,
// while east's and west's workloads keep handshaking without one
// failure. Revoked, the old ones leave east's bundle: west refuses a leaf
// and a token they signed, and when east's state is restored from before
// the revocation, west refuses the bundle that brings them back.
func TestTaintAndRevokeE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("a federated pair, three agents, two restarts")
	}
	eastGRPC := servertest.ReservePort(t)
	east, west := startSPIFFEPair(t, func(o *server.Config) {
		o.RefreshHint = 2 * time.Second
		o.GRPC = server.GRPCConfig{Listen: eastGRPC, BootstrapFile: servertest.WriteTokenFile(t, eastToken+","+eastWorkload.String()+",reusable\n"),
			TokenReview: server.TokenReviewOff, ReissueSpread: time.Second}
	}, func(o *server.Config) {
		o.RefreshHint = 2 * time.Second
		o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: servertest.WriteTokenFile(t, westToken+","+westWorkload.String()+",reusable\n"),
			TokenReview: server.TokenReviewOff}
	})
	waitFederated(t, west, "east.example", 1, 30*time.Second)
	waitFederated(t, east, "west.example", 1, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	eastSrcs := []*workloadapi.X509Source{x509Source(t, ctx, workloadAgent(t, east, eastToken)), x509Source(t, ctx, workloadAgent(t, east, eastToken))}
	eastAddr := workloadAgent(t, east, eastToken)
	eastSrcs = append(eastSrcs, x509Source(t, ctx, eastAddr))
	westAddr := workloadAgent(t, west, westToken)
	westSrc := x509Source(t, ctx, westAddr)
	westClient, err := workloadapi.New(ctx, workloadapi.WithAddr(westAddr))
	require.NoError(t, err)
	defer westClient.Close()

	oldRoot, oldKey := activeAuthority(t, east, false), activeAuthority(t, east, true)
	before, err := eastSrcs[0].GetX509SVID()
	require.NoError(t, err)
	fetchJWT := func() *jwtsvid.SVID {
		svid, err := workloadapi.FetchJWTSVID(ctx, jwtsvid.Params{Audience: westAudience}, workloadapi.WithAddr(eastAddr))
		require.NoError(t, err)
		return svid
	}
	tokenBefore := fetchJWT()
	require.Equal(t, oldKey.ID, jwtKID(t, tokenBefore.Marshal()))
	stop := handshakes(t, eastSrcs[0], westSrc)

	// Prepare; activate only once west's workload holds the new ones.
	authorityChange(t, east, "prepare", "--x509")
	authorityChange(t, east, "prepare", "--jwt")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 2, authorities(westSrc, east.td), "west's workload holds east's next root")
		assert.Len(c, jwtAuthoritiesOf(t, ctx, westAddr, east), 2, "and its next JWT key")
	}, 60*time.Second, 50*time.Millisecond)
	out := authorityChange(t, east, "activate", "--x509", "--now")
	authorityChange(t, east, "activate", "--jwt", "--now")
	newRoot, newKey := activeAuthority(t, east, false), activeAuthority(t, east, true)
	require.NotEqual(t, oldRoot.ID, newRoot.ID, out)

	// Taint, and restart at once: the re-issue resumes from the state.
	stateBeforeRevoke := copyDir(t, filepath.Join(east.dataDir, "ca"))
	authorityChange(t, east, "taint", "--x509", oldRoot.ID)
	authorityChange(t, east, "taint", "--jwt", oldKey.ID)
	east.restart(t)
	for i, src := range eastSrcs {
		require.Eventually(t, func() bool {
			svid, err := src.GetX509SVID()
			return err == nil && hexOf(svid.Certificates[0].AuthorityKeyId) == newRoot.SubjectKeyID
		}, 60*time.Second, 50*time.Millisecond, "east workload %d is re-issued from the new root", i)
	}
	assert.Equal(t, newKey.ID, jwtKID(t, fetchJWT().Marshal()), "a JWT-SVID of the tainted key is not served again")
	assert.NotNil(t, authorityOf(t, east, oldRoot.ID).TaintedAt, "the taint survived the restart")

	// Revoke: gone from east's bundle, and from west's trust. East
	// restarted since the old root signed: its ledger cannot vouch that
	// nothing of it is in use, so revoke wants --force (every workload
	// was checked above).
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "authority", "revoke", "--x509", oldRoot.ID, "--admin", east.admin, "--data-dir", east.dataDir)
	require.Equal(t, 1, code)
	assert.Contains(t, stderr, "cannot tell whether workloads still present what it signed")
	assert.Contains(t, stderr, "before this replica began counting")
	authorityChange(t, east, "revoke", "--x509", oldRoot.ID, "--force")
	authorityChange(t, east, "revoke", "--jwt", oldKey.ID, "--force")
	waitFederated(t, west, "east.example", authorityList(t, east).Sequence, 30*time.Second)
	require.Eventually(t, func() bool { return authorities(westSrc, east.td) == 1 }, 30*time.Second, 50*time.Millisecond)
	n, failures := stop()
	assert.Empty(t, failures, "no handshake between east and west failed in %d, from preparation to revocation", n)
	assert.Greater(t, n, 10)

	_, _, err = x509svid.Verify(before.Certificates, westSrc)
	assert.Error(t, err, "west refuses a leaf of the revoked root")
	_, err = westClient.ValidateJWTSVID(ctx, tokenBefore.Marshal(), westAudience)
	assert.Error(t, err, "west refuses a JWT-SVID of the revoked key")

	// east's state restored from before the revocation publishes the old
	// root again: west refuses that bundle and keeps the last good one.
	east.stop()
	require.NoError(t, os.RemoveAll(filepath.Join(east.dataDir, "ca")))
	require.NoError(t, os.Rename(stateBeforeRevoke, filepath.Join(east.dataDir, "ca")))
	east.restart(t)
	require.Eventually(t, func() bool {
		st, ok := federationStatus(t, west, "east.example")
		return ok && strings.Contains(st.LastError, "revoked")
	}, 30*time.Second, 50*time.Millisecond, "west refuses the bundle that brings the revoked root back")
	assert.Equal(t, 1, authorities(westSrc, east.td), "west's workload still trusts only the new root")
}

// copyDir copies dir beside it, as a backup would: file modes kept (the
// server refuses a key readable by others).
func copyDir(t *testing.T, dir string) string {
	t.Helper()
	dst := dir + ".copy"
	require.NoError(t, os.CopyFS(dst, os.DirFS(dir)))
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		return os.Chmod(filepath.Join(dst, rel), info.Mode().Perm())
	}))
	return dst
}

func authorityOf(t *testing.T, s *e2eServer, id string) api.CAAuthority {
	t.Helper()
	list := authorityList(t, s)
	for _, a := range append(list.X509, list.JWT...) {
		if a.ID == id {
			return a
		}
	}
	t.Fatalf("%s lists no authority %s", s.td.Name(), id)
	return api.CAAuthority{}
}

func jwtKID(t *testing.T, token string) string {
	t.Helper()
	header, _, ok := strings.Cut(token, ".")
	require.True(t, ok)
	raw, err := base64URL(header)
	require.NoError(t, err)
	var h struct {
		KID string `json:"kid"`
	}
	require.NoError(t, json.Unmarshal(raw, &h))
	return h.KID
}

// jwtAuthoritiesOf are the JWT authorities of s's trust domain the agent
// at addr gives its workloads.
func jwtAuthoritiesOf(t *testing.T, ctx context.Context, addr string, s *e2eServer) map[string]any {
	t.Helper()
	bundles, err := workloadapi.FetchJWTBundles(ctx, workloadapi.WithAddr(addr))
	if err != nil {
		return nil
	}
	b, err := bundles.GetJWTBundleForTrustDomain(s.td)
	if err != nil {
		return nil
	}
	out := map[string]any{}
	for kid, k := range b.JWTAuthorities() {
		out[kid] = k
	}
	return out
}

func hexOf(b []byte) string { return hex.EncodeToString(b) }

func base64URL(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
