package istiotest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	meshconfig "istio.io/api/mesh/v1alpha1"
	"istio.io/istio/pilot/cmd/pilot-agent/options"
	"istio.io/istio/pkg/config/mesh"
	"istio.io/istio/pkg/envoy"
	istioagent "istio.io/istio/pkg/istio-agent"
	"istio.io/istio/pkg/security"
	"istio.io/istio/security/pkg/nodeagent/sds"
)

const (
	// nodeSocketProcessOut, when set, makes TestIstioAgentNodeSocketProcess
	// run as the Istio agent and write what it decided into that directory.
	nodeSocketProcessOut = "TRUSTBRIDGE_ISTIO_NODE_SOCKET_OUT"
	// nodeSocketTemplate is the Envoy bootstrap template of the pinned
	// Istio module, which pilot-agent's image holds at
	// /var/lib/istio/envoy/envoy_bootstrap_tmpl.json.
	nodeSocketTemplate = "TRUSTBRIDGE_ISTIO_BOOTSTRAP_TEMPLATE"
	// spiffeValidator is the name of Envoy's SPIFFE certificate validator.
	spiffeValidator = "envoy.tls.cert_validator.spiffe"
)

// TestIstioAgentUsesTrustbridgeSocket: with trustbridge's agent serving
// SDS at the path Istio's agent looks for
// (./var/run/secrets/workload-spiffe-uds/socket, relative to the working
// directory of both), Istio's agent (pilot-agent's Run, with a stand-in
// for the Envoy binary that keeps the bootstrap it is given) serves no
// workload certificates of its own: it makes no CA client, serves files
// only on a socket of its own, leaves ours alone, and points Envoy's
// sds-grpc cluster at ours. What Envoy then gets there is the workload's
// certificate as default and, with --rootca spiffe, Envoy's SPIFFE
// validator as ROOTCA: the local trust domain and the federated one the
// trust policy grants the workload, limited to the one peer it names (the
// SAN an Istio principal of that peer matches).
//
// The agent here is the one-identity agent: the node agent (--node)
// needs a server that accepts the node's Kubernetes token for
// impersonation (--ca-trusted-node-accounts needs --token-review), which
// this module has no API server for. Its socket, path and SDS resources
// are the same.
func TestIstioAgentUsesTrustbridgeSocket(t *testing.T) {
	bin := trustbridgeBinary(t)
	dir := docDir(t)
	peer, federate := startFederatedPeer(t, bin, dir)
	policy := filepath.Join(dir, "trust-policy.yaml")
	require.NoError(t, os.WriteFile(policy, []byte(partnerPolicy), 0o600))
	srv, ca := startAgentCA(t, bin, dir, "--federate", federate, "--federation-allow-private", "--trust-policy", policy)
	sock := startTrustbridgeAgent(t, bin, dir, ca, "--rootca", "spiffe")
	require.Equal(t, filepath.Join(dir, security.GetIstioSDSServerSocketPath()), sock,
		"trustbridge agent's default --sds-socket is not where Istio's agent looks")
	ours, err := os.Stat(sock)
	require.NoError(t, err)
	// istiod's root (the istio-ca-root-cert ConfigMap), with which Istio's
	// agent still checks istiod for xDS.
	xdsRoot := filepath.Join(dir, "var/run/secrets/istio/root-cert.pem")
	require.NoError(t, os.MkdirAll(filepath.Dir(xdsRoot), 0o755))
	require.NoError(t, os.WriteFile(xdsRoot, readFile(t, ca.caRootFile(t)), 0o644))

	decided := runIstioAgentOnSocket(t, dir)
	t.Run("Istio's agent leaves SDS to the socket", func(t *testing.T) {
		assert.True(t, decided.ServeOnlyFiles, "Istio's agent did not see our socket: it serves workload certificates itself")
		assert.False(t, decided.CAClient, "Istio's agent made a CA client")
		pipe := sdsClusterPipe(t, decided.Bootstrap)
		got, err := os.Stat(filepath.Join(dir, pipe))
		require.NoError(t, err, "Envoy's sds-grpc cluster points at %s", pipe)
		assert.True(t, os.SameFile(ours, got), "Envoy's sds-grpc cluster (%s) is not trustbridge's socket", pipe)
		assert.True(t, decided.FilesSocket, "Istio's agent serves files on a socket of its own, %s", security.FileCredentialNameSocketPath)
	})

	conn := dialSDS(t, sock)
	def := fetchSecretOnce(t, conn, security.WorkloadKeyCertResourceName)
	// The server fetches the peer's bundle after it starts; the agent
	// pushes ROOTCA again when the server's decision for the workload
	// grants it.
	rootCA := awaitSecret(t, conn, security.RootCertReqResourceName, time.Minute, func(s *tlsv3.Secret) bool {
		_, ok := spiffeValidatorRoots(t, s)[peerTrustDomain]
		return ok
	})
	roots := spiffeValidatorRoots(t, rootCA)
	t.Run("ROOTCA is Envoy's SPIFFE validator", func(t *testing.T) {
		assert.Len(t, roots, 2, "the local trust domain and the one federated trust domain the policy grants")
		assertRootsOf(t, roots[trustDomain], srv.trust(t), trustDomain)
		assertRootsOf(t, roots[peerTrustDomain], peer.trust(t), peerTrustDomain)
		// The policy's peer limit, as the SAN matchers Envoy's SPIFFE
		// validator applies after the chain: exactly the partner's
		// gateway, the SPIFFE ID Istio's principal
		// "c.test/ns/pay/sa/gateway" matches, and any local workload.
		var exact, prefix []string
		for _, m := range rootCA.GetValidationContext().GetMatchTypedSubjectAltNames() {
			if e := m.GetMatcher().GetExact(); e != "" {
				exact = append(exact, e)
			}
			if p := m.GetMatcher().GetPrefix(); p != "" {
				prefix = append(prefix, p)
			}
		}
		assert.Equal(t, []string{partnerGateway}, exact)
		assert.Equal(t, []string{"spiffe://" + trustDomain + "/"}, prefix)
	})
	t.Run("default is the workload's X509-SVID", func(t *testing.T) {
		chain := def.GetTlsCertificate().GetCertificateChain().GetInlineBytes()
		require.NotEmpty(t, chain)
		require.NotEmpty(t, def.GetTlsCertificate().GetPrivateKey().GetInlineBytes())
		leaf := parseLeaf(t, chain)
		require.Len(t, leaf.URIs, 1)
		assert.Equal(t, workloadID(), leaf.URIs[0].String())
		pool := x509.NewCertPool()
		for _, c := range roots[trustDomain] {
			pool.AddCert(c)
		}
		assert.NoError(t, verify(t, chain, pool), "default does not verify against ROOTCA's trust domain")
	})
}

// The federated peer of TestIstioAgentUsesTrustbridgeSocket, and the
// trust policy granting the workload one of its workloads only.
const (
	peerTrustDomain = "c.test"
	partnerGateway  = "spiffe://c.test/ns/pay/sa/gateway"
	partnerPolicy   = `default: deny
rules:
- name: web-to-partner-gateway
  workloads:
  - spiffeID: spiffe://example.org/ns/default/sa/web
  trustDomains:
  - name: c.test
    peers: [spiffe://c.test/ns/pay/sa/gateway]
`
)

// startFederatedPeer starts a trustbridge server of peerTrustDomain with
// its https_spiffe bundle endpoint on loopback, and returns it with the
// --federate value that federates with it (its bundle, for the first
// fetch, in a file under dir).
func startFederatedPeer(t *testing.T, bin, dir string) (*server, string) {
	t.Helper()
	peerDir := filepath.Join(dir, "peer")
	require.NoError(t, os.Mkdir(peerDir, 0o700))
	peer := startServerIn(t, bin, peerDir, "--trust-domain", peerTrustDomain, "--data-dir", "data", "--init",
		"--admin-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--bundle-listen", "127.0.0.1:0", "--log-format", "json")
	require.NotEmpty(t, peer.bundleURL, "no bundle endpoint URL in the peer's start-up records")
	out, err := exec.Command(bin, "bundle", "show", "--data-dir", filepath.Join(peerDir, "data"), "-o", "spiffe").Output()
	require.NoError(t, err, "trustbridge bundle show of the peer")
	bundle := filepath.Join(dir, peerTrustDomain+".json")
	require.NoError(t, os.WriteFile(bundle, out, 0o600))
	return peer, strings.Join([]string{peerTrustDomain, peer.bundleURL, "spiffe://" + peerTrustDomain + "/trustbridge/bundle-endpoint", bundle}, "|")
}

// assertRootsOf checks certs are exactly the roots v publishes.
func assertRootsOf(t *testing.T, certs []*x509.Certificate, v trustView, td string) {
	t.Helper()
	var got, want []string
	for _, c := range certs {
		got = append(got, sha256Hex(c.Raw))
	}
	for _, a := range v.Authorities {
		want = append(want, a.SHA256)
	}
	assert.ElementsMatch(t, want, got, "the roots of %s", td)
}

// istioDecision is what Istio's agent decided, as
// TestIstioAgentNodeSocketProcess reports it.
type istioDecision struct {
	ServeOnlyFiles bool   `json:"serve_only_files"`
	CAClient       bool   `json:"ca_client"`
	FilesSocket    bool   `json:"files_socket"`
	Bootstrap      []byte `json:"bootstrap"`
}

// TestIstioAgentNodeSocketProcess is the Istio agent of
// TestIstioAgentUsesTrustbridgeSocket, run by it in a process of its own
// in the directory whose ./var/run/secrets/workload-spiffe-uds/socket
// trustbridge serves.
func TestIstioAgentNodeSocketProcess(t *testing.T) {
	out := os.Getenv(nodeSocketProcessOut)
	if out == "" {
		t.Skip("run by TestIstioAgentUsesTrustbridgeSocket, in the directory of trustbridge's socket")
	}
	// As pilot-agent does (pilot/cmd/pilot-agent/app/cmd.go), with a
	// stand-in for Envoy that keeps its bootstrap and exits.
	proxyConfig := mesh.DefaultProxyConfig()
	proxyConfig.BinaryPath = filepath.Join(out, "envoy")
	proxyConfig.ProxyBootstrapTemplatePath = os.Getenv(nodeSocketTemplate)
	require.NoError(t, os.WriteFile(proxyConfig.BinaryPath,
		[]byte("#!/bin/sh\n# Envoy's first arguments are -c BOOTSTRAP\ncp \"$2\" \""+filepath.Join(out, "bootstrap.json")+"\"\n"), 0o700))
	secOpts, err := options.NewSecurityOptions(proxyConfig, 0, "")
	require.NoError(t, err)
	proxyArgs := options.NewProxyArgs()
	// pilot-agent's main hands it Istio's SDS server as the factory.
	sdsFactory := func(o *security.Options, c security.SecretManager, pkp *meshconfig.PrivateKeyProvider) istioagent.SDSService {
		return sds.NewServer(o, c, pkp)
	}
	agent := istioagent.NewAgent(proxyConfig, options.NewAgentOptions(&proxyArgs, proxyConfig, sdsFactory), secOpts, envoy.ProxyConfig{})
	defer agent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wait, err := agent.Run(ctx)
	require.NoError(t, err, "Istio's agent")
	wait() // until the stand-in Envoy exits
	bootstrap, err := os.ReadFile(filepath.Join(out, "bootstrap.json"))
	require.NoError(t, err, "the stand-in Envoy was not started")
	// Istio's agent makes a CA client only when it serves workload
	// certificates itself (initSdsServer: createCaClient).
	// Its SDS server listens before Run returns (initWorkloadSdsService).
	files, err := os.Stat(security.FileCredentialNameSocketPath)
	d := istioDecision{
		ServeOnlyFiles: secOpts.ServeOnlyFiles,
		CAClient:       !secOpts.ServeOnlyFiles && !secOpts.FileMountedCerts,
		FilesSocket:    err == nil && files.Mode().Type() == os.ModeSocket,
		Bootstrap:      bootstrap,
	}
	b, err := json.Marshal(d)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(out, "decision.json"), b, 0o600))
}

// runIstioAgentOnSocket runs TestIstioAgentNodeSocketProcess in dir and
// returns what Istio's agent decided.
func runIstioAgentOnSocket(t *testing.T, dir string) istioDecision {
	t.Helper()
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestIstioAgentNodeSocketProcess$", "-test.count", "1", "-test.v")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir(), nodeSocketProcessOut + "=" + out,
		nodeSocketTemplate + "=" + filepath.Join(istioModuleDir(t), "tools", "packaging", "common", "envoy_bootstrap.json")}
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "Istio's agent beside trustbridge's socket:\n%s", b)
	require.NotContains(t, string(b), "--- SKIP", "the agent process skipped:\n%s", b)
	var d istioDecision
	require.NoError(t, json.Unmarshal(readFile(t, filepath.Join(out, "decision.json")), &d))
	return d
}

// startTrustbridgeAgent runs `trustbridge agent` in dir with its default
// --sds-socket, for the workload of ca's token, and returns the socket's
// absolute path once it listens. It is stopped when the test ends.
func startTrustbridgeAgent(t *testing.T, bin, dir string, ca agentConfig, extra ...string) string {
	t.Helper()
	args := append([]string{"agent", "--ca-addr", ca.caAddr, "--root-cert", ca.caRootFile(t),
		"--token-file", ca.jwtFile, "--workload-api-socket", "", "--log-format", "json"}, extra...)
	listening := make(chan string, 1)
	stderr, exited := startProcess(t, "trustbridge agent", bin, dir, args, func(r io.Reader, _ int) {
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var rec struct {
				Msg    string `json:"msg"`
				Socket string `json:"socket"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "SDS listening" {
				select {
				case listening <- rec.Socket:
				default: // a second socket: the first is the one asked for
				}
			}
		}
	})
	select {
	case s := <-listening:
		if !filepath.IsAbs(s) {
			s = filepath.Join(dir, s)
		}
		return filepath.Clean(s)
	case <-exited:
		t.Fatalf("trustbridge agent %v exited; stderr:\n%s", args, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("trustbridge agent did not listen within 30s; stderr:\n%s", stderr.String())
	}
	return ""
}

// sdsClusterPipe is the unix socket path of the sds-grpc cluster of an
// Envoy bootstrap Istio's agent generated.
func sdsClusterPipe(t *testing.T, bootstrap []byte) string {
	t.Helper()
	var b struct {
		StaticResources struct {
			Clusters []struct {
				Name           string `json:"name"`
				LoadAssignment struct {
					Endpoints []struct {
						LbEndpoints []struct {
							Endpoint struct {
								Address struct {
									Pipe struct {
										Path string `json:"path"`
									} `json:"pipe"`
								} `json:"address"`
							} `json:"endpoint"`
						} `json:"lb_endpoints"`
					} `json:"endpoints"`
				} `json:"load_assignment"`
			} `json:"clusters"`
		} `json:"static_resources"`
	}
	require.NoError(t, json.Unmarshal(bootstrap, &b), "Istio's Envoy bootstrap")
	for _, c := range b.StaticResources.Clusters {
		if c.Name != "sds-grpc" {
			continue
		}
		require.Len(t, c.LoadAssignment.Endpoints, 1)
		require.Len(t, c.LoadAssignment.Endpoints[0].LbEndpoints, 1)
		p := c.LoadAssignment.Endpoints[0].LbEndpoints[0].Endpoint.Address.Pipe.Path
		require.NotEmpty(t, p, "the sds-grpc cluster has no pipe address")
		return p
	}
	t.Fatal("Istio's Envoy bootstrap has no sds-grpc cluster")
	return ""
}

// fetchSecretOnce asks for one secret on a StreamSecrets stream, as Envoy
// does, ACKs the first response and returns its secret, checked as Envoy
// checks it.
func fetchSecretOnce(t *testing.T, conn *grpc.ClientConn, name string) *tlsv3.Secret {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&discoveryv3.DiscoveryRequest{Node: envoyNode, ResourceNames: []string{name}, TypeUrl: secretTypeURL}))
	resp, err := stream.Recv()
	require.NoError(t, err, "%s from trustbridge's socket", name)
	require.NoError(t, stream.Send(&discoveryv3.DiscoveryRequest{Node: envoyNode, ResourceNames: []string{name}, TypeUrl: secretTypeURL,
		ResponseNonce: resp.GetNonce(), VersionInfo: resp.GetVersionInfo()}))
	return decodeSecret(t, resp, name)
}

// awaitSecret watches name on a StreamSecrets stream, ACKing every
// response as Envoy does, until a secret satisfies cond, and returns it;
// it fails the test after within.
func awaitSecret(t *testing.T, conn *grpc.ClientConn, name string, within time.Duration, cond func(*tlsv3.Secret) bool) *tlsv3.Secret {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	require.NoError(t, err)
	req := &discoveryv3.DiscoveryRequest{Node: envoyNode, ResourceNames: []string{name}, TypeUrl: secretTypeURL}
	for {
		require.NoError(t, stream.Send(req))
		resp, err := stream.Recv()
		require.NoError(t, err, "waiting for %s from trustbridge's socket", name)
		s := decodeSecret(t, resp, name)
		if cond(s) {
			return s
		}
		req = &discoveryv3.DiscoveryRequest{Node: envoyNode, ResourceNames: []string{name}, TypeUrl: secretTypeURL,
			ResponseNonce: resp.GetNonce(), VersionInfo: resp.GetVersionInfo()}
	}
}

// decodeSecret is the one secret of resp, checked as Envoy checks it.
func decodeSecret(t *testing.T, resp *discoveryv3.DiscoveryResponse, name string) *tlsv3.Secret {
	t.Helper()
	require.Equal(t, secretTypeURL, resp.GetTypeUrl())
	require.Len(t, resp.GetResources(), 1)
	var s tlsv3.Secret
	require.NoError(t, resp.GetResources()[0].UnmarshalTo(&s))
	require.NoError(t, s.ValidateAll())
	require.Equal(t, name, s.GetName())
	return &s
}

// spiffeValidatorRoots decodes a validation context secret that must be
// Envoy's SPIFFE validator: its roots per trust domain, each name unique
// and without the spiffe:// prefix, as Envoy requires.
func spiffeValidatorRoots(t *testing.T, s *tlsv3.Secret) map[string][]*x509.Certificate {
	t.Helper()
	cv := s.GetValidationContext().GetCustomValidatorConfig()
	require.NotNil(t, cv, "%s is not a custom validator: %v", s.GetName(), s.GetValidationContext())
	require.Equal(t, spiffeValidator, cv.GetName())
	var cfg tlsv3.SPIFFECertValidatorConfig
	require.NoError(t, cv.GetTypedConfig().UnmarshalTo(&cfg))
	require.NoError(t, cfg.ValidateAll())
	roots := map[string][]*x509.Certificate{}
	for _, td := range cfg.GetTrustDomains() {
		require.False(t, strings.HasPrefix(td.GetName(), "spiffe://"), "Envoy wants trust domain names without spiffe://: %q", td.GetName())
		_, dup := roots[td.GetName()]
		require.False(t, dup, "trust domain %s listed twice", td.GetName())
		roots[td.GetName()] = parsePEM(t, td.GetTrustBundle().GetInlineBytes())
	}
	return roots
}

// istioModuleDir is where the pinned istio.io/istio module is.
func istioModuleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio").Output()
	require.NoError(t, err, "go list -m istio.io/istio")
	return strings.TrimSpace(string(out))
}

func sha256Hex(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s does not exist", name)
	}
	require.NoError(t, err)
	return b
}
