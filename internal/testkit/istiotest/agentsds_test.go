package istiotest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"istio.io/istio/pkg/security"
	"istio.io/istio/security/pkg/nodeagent/sds"
)

// workloadTTL is short so that the agent renews within the test: at the
// grace ratio it renews every workloadTTL/2.
const workloadTTL = 10 * time.Second

// secretTypeURL is the SDS type, taken from the proto Envoy decodes.
var secretTypeURL = "type.googleapis.com/" + string((&tlsv3.Secret{}).ProtoReflect().Descriptor().FullName())

// TestIstioAgentSDS is the istio-agent flow end to end: Istio's agent cache
// over its citadel CA client gets certificates from a real trustbridge,
// Istio's own SDS server serves them on the agent's unix socket, and an
// Envoy-like client built on go-control-plane's SDS stubs watches default
// and ROOTCA on that socket, ACKing each response. default must be an
// X509-SVID for the workload that verifies against ROOTCA; the agent must
// push a renewed default at its grace ratio; and after a trustbridge root
// rotation the pushed ROOTCA must hold both roots while default, old and
// renewed, still verifies against it.
func TestIstioAgentSDS(t *testing.T) {
	bin := trustbridgeBinary(t)
	srv, agent := startAgentCA(t, bin, t.TempDir(), "--workload-ttl", workloadTTL.String())
	def, rootCA := startAgentSDS(t, agent)

	before := srv.trust(t)
	require.Len(t, before.Authorities, 1, "a fresh server publishes one root")
	first := def.next(t, 30*time.Second, "the first default")
	roots := rootCA.next(t, 30*time.Second, "the first ROOTCA")
	t.Run("first secrets", func(t *testing.T) {
		assertSVID(t, first, roots)
		assertRootCAHolds(t, agentSecrets{rootCA: roots.rootCA, chain: first.chain}, before)
	})

	renewed := def.await(t, workloadTTL+10*time.Second, "a renewed default", func(u sdsUpdate) bool {
		return u.leaf.SerialNumber.Cmp(first.leaf.SerialNumber) != 0
	})
	t.Run("renewed at the grace ratio", func(t *testing.T) {
		assert.NotEqual(t, first.version, renewed.version, "a renewal is a new version")
		// The agent renews when graceRatio of the certificate's life is
		// left; its life is at most workloadTTL, as it counts from when
		// it received the certificate.
		due := first.leaf.NotAfter.Add(-time.Duration(graceRatio * float64(workloadTTL)))
		assert.False(t, renewed.at.Before(due.Add(-time.Second)),
			"renewed at %v, before %v, when %v of the life of a certificate expiring %v is left",
			renewed.at, due, graceRatio, first.leaf.NotAfter)
		assert.True(t, renewed.at.Before(due.Add(workloadTTL/4)),
			"renewed at %v, over %v after it was due at %v", renewed.at, workloadTTL/4, due)
		assertSVID(t, renewed, roots)
	})

	runCLI(t, bin, "ca", "rotate", "--data-dir", agent.dataDir)
	during := srv.waitTrust(t, publishWithin, "the successor root published", func(v trustView) bool {
		return len(v.Authorities) == 2
	})
	// The agent learns of the new root with its next renewal, and pushes
	// ROOTCA because the root bundle changed.
	both := rootCA.await(t, workloadTTL+10*time.Second, "ROOTCA with both roots", func(u sdsUpdate) bool {
		return len(parsePEM(t, u.rootCA)) == 2
	})
	last := def.latest(t)
	t.Run("across a root rotation", func(t *testing.T) {
		assertRootCAHolds(t, agentSecrets{rootCA: both.rootCA, chain: last.chain}, during)
		assert.NoError(t, verifyAt(t, renewed, both), "a certificate issued before the rotation no longer verifies")
	})

	after := def.await(t, workloadTTL+10*time.Second, "default renewed after the root rotation", func(u sdsUpdate) bool {
		return u.leaf.SerialNumber.Cmp(last.leaf.SerialNumber) != 0
	})
	t.Run("renewed after the root rotation", func(t *testing.T) {
		assertSVID(t, after, both)
		assertRootCAHolds(t, agentSecrets{rootCA: both.rootCA, chain: after.chain}, during)
	})
}

// startAgentSDS runs what the istio-agent runs for a sidecar: its cache over
// the citadel CA client and its SDS server on the agent's socket, under
// agent.dir. It returns Envoy's two SDS subscriptions to that socket.
func startAgentSDS(t *testing.T, agent agentConfig) (def, rootCA *secretWatch) {
	t.Helper()
	// Istio's SDS server listens on a fixed path relative to the working
	// directory (./var/run/secrets/workload-spiffe-uds/socket).
	t.Chdir(agent.dir)
	opts := agent.options(workloadTTL)
	secrets := agent.secretManager(t, opts)
	t.Cleanup(secrets.Close)
	sdsServer := sds.NewServer(opts, secrets, nil)
	t.Cleanup(sdsServer.Stop)
	// As the istio-agent wires them: a renewal in the cache becomes a push.
	secrets.RegisterSecretHandler(sdsServer.OnSecretUpdate)

	conn := dialSDS(t, filepath.Join(agent.dir, security.GetIstioSDSServerSocketPath()))
	return watchSecret(t, conn, security.WorkloadKeyCertResourceName),
		watchSecret(t, conn, security.RootCertReqResourceName)
}

// assertSVID checks default as an X509-SVID for the workload (X509-SVID
// §4, §5) with a private key that matches it, verifying against roots'
// ROOTCA when it was received.
func assertSVID(t *testing.T, u, roots sdsUpdate) {
	t.Helper()
	_, err := tls.X509KeyPair(u.chain, u.key)
	assert.NoError(t, err, "default's private key does not match its certificate")
	leaf := u.leaf
	require.Len(t, leaf.URIs, 1, "an X509-SVID has exactly one URI SAN")
	assert.Equal(t, workloadID(), leaf.URIs[0].String())
	assert.False(t, leaf.IsCA, "an X509-SVID leaf is not a CA")
	assert.Zero(t, leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign), "an X509-SVID leaf must not sign certificates or CRLs")
	assert.NotZero(t, leaf.KeyUsage&x509.KeyUsageDigitalSignature, "an X509-SVID leaf must have digitalSignature")
	assert.NoError(t, verifyAt(t, u, roots), "default does not verify against ROOTCA")
}

// verifyAt verifies u's chain against roots' ROOTCA at the time u was
// received, so that a slow machine does not turn a short-lived certificate
// into a failure.
func verifyAt(t *testing.T, u, roots sdsUpdate) error {
	t.Helper()
	pool := x509.NewCertPool()
	for _, c := range parsePEM(t, roots.rootCA) {
		pool.AddCert(c)
	}
	chain := parsePEM(t, u.chain)
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := u.leaf.Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: inter, CurrentTime: u.at,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	return err
}

// dialSDS connects to the agent's SDS socket as Envoy's sds-grpc cluster
// does: plaintext over the unix socket.
func dialSDS(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// sdsUpdate is one secret as an SDS response delivered it, decoded.
type sdsUpdate struct {
	version string
	at      time.Time // when it was received
	chain   []byte    // tls_certificate's certificate chain
	key     []byte    // tls_certificate's private key
	leaf    *x509.Certificate
	rootCA  []byte // validation_context's trusted CA
}

// secretWatch is one Envoy SDS subscription: Envoy opens a stream per
// secret name on the SDS cluster.
type secretWatch struct {
	name    string
	updates chan sdsUpdate
	errs    chan error
	last    sdsUpdate
}

// watchSecret opens a StreamSecrets stream for name and ACKs (or NACKs,
// keeping the previous version) every response, as Envoy does. Updates
// arrive on the returned watch until the test ends.
func watchSecret(t *testing.T, conn *grpc.ClientConn, name string) *secretWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	require.NoError(t, err)
	w := &secretWatch{name: name, updates: make(chan sdsUpdate, 64), errs: make(chan error, 1)}
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	go func() {
		defer close(done)
		err := w.run(ctx, stream)
		if ctx.Err() == nil {
			w.errs <- err
		}
	}()
	return w
}

// envoyNode is the node a sidecar's Envoy declares.
var envoyNode = &corev3.Node{
	Id:      fmt.Sprintf("sidecar~127.0.0.1~%s-0.%s~%s.svc.cluster.local", account, namespace, namespace),
	Cluster: account + "." + namespace,
}

func (w *secretWatch) run(ctx context.Context, stream secretv3.SecretDiscoveryService_StreamSecretsClient) error {
	req := &discoveryv3.DiscoveryRequest{Node: envoyNode, ResourceNames: []string{w.name}, TypeUrl: secretTypeURL}
	if err := stream.Send(req); err != nil {
		return fmt.Errorf("%s: first request: %w", w.name, err)
	}
	accepted := ""
	for {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("%s: stream: %w", w.name, err)
		}
		u, decodeErr := w.decode(resp)
		ack := &discoveryv3.DiscoveryRequest{
			Node: envoyNode, ResourceNames: []string{w.name}, TypeUrl: secretTypeURL,
			ResponseNonce: resp.GetNonce(), VersionInfo: resp.GetVersionInfo(),
		}
		if decodeErr != nil {
			ack.VersionInfo = accepted
			ack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: decodeErr.Error()}
		}
		if err := stream.Send(ack); err != nil {
			return fmt.Errorf("%s: ACK of version %q: %w", w.name, resp.GetVersionInfo(), err)
		}
		if decodeErr != nil {
			return decodeErr
		}
		accepted = resp.GetVersionInfo()
		select {
		case w.updates <- u:
		case <-ctx.Done():
			return nil
		}
	}
}

// decode checks a response as Envoy would before applying it: the type,
// the one secret asked for, its proto constraints, and its PEM.
func (w *secretWatch) decode(resp *discoveryv3.DiscoveryResponse) (sdsUpdate, error) {
	u := sdsUpdate{version: resp.GetVersionInfo(), at: time.Now()}
	if resp.GetTypeUrl() != secretTypeURL {
		return u, fmt.Errorf("%s: response of type %q", w.name, resp.GetTypeUrl())
	}
	if len(resp.GetResources()) != 1 {
		return u, fmt.Errorf("%s: response version %q holds %d resources, want 1", w.name, u.version, len(resp.GetResources()))
	}
	var secret tlsv3.Secret
	if err := resp.GetResources()[0].UnmarshalTo(&secret); err != nil {
		return u, fmt.Errorf("%s: %w", w.name, err)
	}
	if err := secret.ValidateAll(); err != nil {
		return u, fmt.Errorf("%s: %w", w.name, err)
	}
	if secret.GetName() != w.name {
		return u, fmt.Errorf("%s: response holds secret %q", w.name, secret.GetName())
	}
	if w.name == security.RootCertReqResourceName {
		u.rootCA = secret.GetValidationContext().GetTrustedCa().GetInlineBytes()
		if len(u.rootCA) == 0 {
			return u, fmt.Errorf("%s: no inline trusted_ca in validation_context", w.name)
		}
		return u, nil
	}
	u.chain = secret.GetTlsCertificate().GetCertificateChain().GetInlineBytes()
	u.key = secret.GetTlsCertificate().GetPrivateKey().GetInlineBytes()
	if len(u.chain) == 0 || len(u.key) == 0 {
		return u, fmt.Errorf("%s: tls_certificate without an inline certificate chain and private key", w.name)
	}
	var err error
	if u.leaf, err = parseLeafPEM(u.chain); err != nil {
		return u, fmt.Errorf("%s: %w", w.name, err)
	}
	return u, nil
}

// parseLeafPEM is the first certificate of a PEM chain.
func parseLeafPEM(chain []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(chain)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("the certificate chain does not start with a PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// next is the next update, failing the test after within.
func (w *secretWatch) next(t *testing.T, within time.Duration, what string) sdsUpdate {
	t.Helper()
	select {
	case u := <-w.updates:
		w.last = u
		return u
	default:
	}
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case u := <-w.updates:
		w.last = u
		return u
	case err := <-w.errs:
		t.Fatalf("waiting for %s: %v", what, err)
	case <-timer.C:
		t.Fatalf("waiting for %s: no %s pushed within %v", what, w.name, within)
	}
	return sdsUpdate{}
}

// await consumes updates until one satisfies cond, failing after within.
func (w *secretWatch) await(t *testing.T, within time.Duration, what string, cond func(sdsUpdate) bool) sdsUpdate {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		u := w.next(t, time.Until(deadline), what)
		if cond(u) {
			return u
		}
	}
}

// latest is the newest update received so far.
func (w *secretWatch) latest(t *testing.T) sdsUpdate {
	t.Helper()
	for {
		select {
		case u := <-w.updates:
			w.last = u
		default:
			require.False(t, w.last.at.IsZero(), "no %s received yet", w.name)
			return w.last
		}
	}
}
