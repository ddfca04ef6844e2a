package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/catest"
	"github.com/trustbridge/trustbridge/ca/upstream/trustbridge"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// regionID is the downstream trustbridge the grant target allows.
var regionID = spiffeid.RequireFromString("spiffe://example.org/region/eu")

// grantTarget is a server with --downstream-allow regionID and
// --max-renewal-lifetime 720h, and credential directories of regionID
// (cert-chain.pem, key.pem): fresh, bought with a bootstrap token that is
// still listed, and fallen, each a certificate whose grant no longer
// stands, as issue 32's attacker holds one.
type grantTarget struct {
	*attackTarget
	roots    []*x509.Certificate
	services map[string]grpc.ServiceInfo
	fresh    string
	fallen   map[string]string // kind → directory
}

func newGrantTarget(t *testing.T) *grantTarget {
	t.Helper()
	const (
		envoyToken  = "envoy-bootstrap-token-0123456789"
		goneToken   = "gone-bootstrap-token-0123456789"
		regionToken = "region-bootstrap-token-012345678"
	)
	line := func(token, extra string) string { return token + "," + regionID.String() + extra + "\n" }
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(tokens, []byte(line(envoyToken, ",reusable")+line(goneToken, "")+line(regionToken, "")), 0o600))
	reloaded := make(chan struct{}, 1)
	services := make(chan map[string]grpc.ServiceInfo, 1)
	dataDir := t.TempDir()
	g := &grantTarget{fallen: map[string]string{}}
	g.attackTarget = startAttackTarget(t, func(o *server.Config) {
		o.DataDir = dataDir
		o.GRPC.BootstrapFile = tokens
		o.GRPC.Downstream.Allow = []string{regionID.String()}
		o.GRPC.MaxRenewalLifetime = 720 * time.Hour
		o.GRPC.GrantHooks = server.GrantHooks{
			BootstrapReload: 10 * time.Millisecond,
			OnBootstrapReload: func(changed bool, err error) {
				if changed && err == nil {
					select {
					case reloaded <- struct{}{}:
					default:
					}
				}
			},
			OnGRPCServices: func(m map[string]grpc.ServiceInfo) { services <- m },
		}
	})
	select {
	case g.services = <-services:
	default:
		t.Fatal("the server did not report the services on its certificate listener")
	}
	_, roots, err := ca.NewStore(dataDir).Load("example.org")
	require.NoError(t, err)
	require.NotEmpty(t, roots)
	for _, r := range roots {
		g.roots = append(g.roots, r.Cert)
	}
	rootCert := servertest.WriteFile(t, string(cli.CertsPEM(g.roots)), 0o644)
	request := func(token string) string {
		dir := filepath.Join(t.TempDir(), "creds")
		_, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", g.grpc, "--root-cert", rootCert,
			"--token-file", servertest.WriteFile(t, token+"\n", 0o600), "--credentials-dir", dir)
		require.Equal(t, 0, code, stderr)
		return dir
	}
	g.fresh = request(regionToken)

	// The operator removes a token (atomically, as the flag says).
	gone := request(goneToken)
	next := tokens + ".new"
	require.NoError(t, os.WriteFile(next, []byte(line(envoyToken, ",reusable")+line(regionToken, "")), 0o600))
	require.NoError(t, os.Rename(next, tokens))
	select {
	case <-reloaded:
	case <-t.Context().Done():
		t.Fatal("the token file was not reloaded")
	}
	g.fallen["bootstrap token removed"] = gone

	// An Envoy with a token for the downstream's ID gets a certificate
	// minted by SDS.
	e := openEnvoy(t, dialSDSTLS(t, g.grpc, regionID.TrustDomain(), g.roots, envoyToken), nil, sds.DefaultName)
	s, ok := secrets(t, e.recv(30*time.Second))[sds.DefaultName]
	require.True(t, ok, "SDS serves the caller's certificate")
	tc := s.GetTlsCertificate()
	g.fallen["certificate minted by SDS"] = writeCertDir(t, tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())

	// A chain our CA signed, first granted longer ago than the maximum
	// renewal lifetime by a token still listed.
	grant := authn.Grant{Method: authn.MethodBootstrapToken, Ref: authn.BootstrapGrantRef(sha256.Sum256([]byte(regionToken))),
		GrantedAt: time.Now().Add(-721 * time.Hour)}
	ext, err := grant.Extension()
	require.NoError(t, err)
	root := &testca.CA{TrustDomain: regionID.TrustDomain(), Cert: roots[len(roots)-1].Cert, Key: roots[len(roots)-1].Key}
	leaf, key := root.Issue(t, regionID, testca.Options{NotAfter: time.Now().Add(time.Hour),
		Mutate: func(c *x509.Certificate) { c.ExtraExtensions = []pkix.Extension{ext} }})
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	g.fallen["chain older than --max-renewal-lifetime"] = writeCertDir(t, cli.CertsPEM([]*x509.Certificate{leaf}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	return g
}

// writeCertDir writes a credentials directory as `ca request` does.
func writeCertDir(t *testing.T, chainPEM, keyPEM []byte) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cert-chain.pem"), chainPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600))
	return dir
}

// intermediateCSR is what a downstream sends: a CSR for the trust domain.
func intermediateCSR(t testing.TB) []byte {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{regionID.TrustDomain().ID().URL()}}, key)
	require.NoError(t, err)
	return der
}

// TestSignIntermediateRefusedForFallenGrant is issue 32's attack end to
// end: a downstream ID's certificate that SDS minted for an Envoy, or
// whose bootstrap token was removed, or whose chain is older than
// --max-renewal-lifetime, asks for an intermediate as a region's
// --upstream trustbridge client would. Each is refused, counted and
// logged with its grant's fault; the downstream whose grant stands still
// gets its intermediate.
func TestSignIntermediateRefusedForFallenGrant(t *testing.T) {
	g := newGrantTarget(t)
	ask := func(dir string) (*ca.UpstreamChain, error) {
		c, err := trustbridge.New(trustbridge.Config{Address: g.grpc, Roots: g.roots, ProvCertDir: dir, Timeout: 10 * time.Second})
		require.NoError(t, err)
		return c.SignIntermediate(t.Context(), intermediateCSR(t), time.Hour)
	}
	for kind, dir := range g.fallen {
		_, err := ask(dir)
		assert.Equal(t, codes.Unauthenticated, status.Code(err), "%s: %v", kind, err)
	}
	chain, err := ask(g.fresh)
	require.NoError(t, err)
	require.NotEmpty(t, chain.Chain)
	assert.True(t, chain.Chain[0].IsCA)
	pool := x509.NewCertPool()
	for _, r := range g.roots {
		pool.AddCert(r)
	}
	_, err = chain.Chain[0].Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	assert.NoError(t, err, "the intermediate verifies against the roots")

	const counter = "trustbridge_certservice_intermediates_total"
	assert.Equal(t, float64(len(g.fallen)), g.metric(t, counter, `code="Unauthenticated"`, `method="none"`))
	assert.Equal(t, 1.0, g.metric(t, counter, `code="OK"`, `method="x509-svid"`))
	assert.Equal(t, float64(len(g.fallen)+1), g.metric(t, counter), "nothing else was counted")
	assert.Equal(t, len(g.fallen), g.logCount("INFO", `"msg":"intermediate request refused"`))
	assert.Equal(t, 1, g.logCount("INFO", `"msg":"intermediate issued"`))
	logs := g.logs.String()
	for _, fault := range []string{"minted by SDS for Envoy", "is no longer listed in", authn.ErrGrantExpired.Error()} {
		assert.Contains(t, logs, fault)
	}
}

var sdsNode = &corev3.Node{Id: "sidecar~10.0.0.1~test~default.svc.cluster.local", Cluster: "test"}

// listenerRPCs has a row for every RPC of every service on the
// certificate listener: the certificate service's (catest.CertServiceRPCs)
// and SDS's. A new one needs a row: decide how it authenticates, and make
// it refuse a certificate whose grant no longer stands, as every RPC here
// does.
var listenerRPCs = func() map[string]catest.RPC {
	rpcs := catest.CertServiceRPCs(func(tb testing.TB) string {
		key, err := ca.GenerateKey(ca.KeyECP256)
		require.NoError(tb, err)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		require.NoError(tb, err)
		return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	}, intermediateCSR)
	for m, rpc := range sdsRPCs {
		rpcs[m] = rpc
	}
	return rpcs
}()

// sdsRPCs are SDS's rows of listenerRPCs.
var sdsRPCs = map[string]catest.RPC{
	secretv3.SecretDiscoveryService_StreamSecrets_FullMethodName: {Refused: codes.Unauthenticated,
		Call: func(t *testing.T, conn *grpc.ClientConn) error {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
			if err != nil {
				return err
			}
			// io.EOF: the server already ended the stream; Recv says why.
			_ = stream.Send(&discoveryv3.DiscoveryRequest{Node: sdsNode, TypeUrl: resourcev3.SecretType, ResourceNames: []string{sds.RootCAName}})
			_, err = stream.Recv()
			return err
		}},
	secretv3.SecretDiscoveryService_DeltaSecrets_FullMethodName: {Refused: codes.Unauthenticated,
		Call: func(t *testing.T, conn *grpc.ClientConn) error {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).DeltaSecrets(ctx)
			if err != nil {
				return err
			}
			_ = stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: sdsNode, TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: []string{sds.RootCAName}})
			_, err = stream.Recv()
			return err
		}},
	secretv3.SecretDiscoveryService_FetchSecrets_FullMethodName: {Refused: codes.Unauthenticated,
		Call: func(t *testing.T, conn *grpc.ClientConn) error {
			_, err := secretv3.NewSecretDiscoveryServiceClient(conn).FetchSecrets(t.Context(),
				&discoveryv3.DiscoveryRequest{Node: sdsNode, TypeUrl: resourcev3.SecretType, ResourceNames: []string{sds.RootCAName}})
			return err
		}},
}

// TestCertificateListenerRefusesFallenGrants holds every RPC of every
// service the running server registers on its certificate listener
// (Istio's certificate service, the identity service, SDS, and whatever
// is added) to the grant checks: each serves the downstream whose grant
// stands and refuses each certificate whose grant fell. An RPC without a
// row in listenerRPCs fails the test.
func TestCertificateListenerRefusesFallenGrants(t *testing.T) {
	g := newGrantTarget(t)
	var registered []string
	for name, info := range g.services {
		for _, m := range info.Methods {
			registered = append(registered, "/"+name+"/"+m.Name)
		}
	}
	slices.Sort(registered)
	for _, m := range registered {
		if _, ok := listenerRPCs[m]; !ok {
			t.Fatalf("%s is served on the certificate listener but has no row in listenerRPCs: decide how it authenticates, and refuse a certificate whose grant no longer stands", m)
		}
	}
	for m := range listenerRPCs {
		assert.Contains(t, registered, m, "a row for an RPC the listener no longer serves")
	}
	dial := func(dir string) *grpc.ClientConn {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem"))
		require.NoError(t, err)
		return dialSDSWithCert(t, g.grpc, g.roots, &cert)
	}
	fresh := dial(g.fresh)
	for _, m := range registered {
		assert.NoError(t, listenerRPCs[m].Call(t, fresh), "%s serves a certificate whose grant stands", m)
	}
	for kind, dir := range g.fallen {
		conn := dial(dir)
		for _, m := range registered {
			err := listenerRPCs[m].Call(t, conn)
			assert.Equal(t, listenerRPCs[m].Refused, status.Code(err), "%s, %s: %v", kind, m, err)
		}
	}
}
