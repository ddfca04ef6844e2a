package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/trustbridge/trustbridge/ca/kubestore"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/federation/distribution"
	"github.com/trustbridge/trustbridge/federation/kubelkg"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/kube/leader"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

func TestKubeStorageFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    server.KubeConfig
		want string
	}{
		{"unknown storage", server.KubeConfig{Storage: "etcd"}, `--storage "etcd"`},
		{"bad selector", server.KubeConfig{Storage: server.StorageKube, NamespaceSelector: "a in (("}, "--namespace-selector"},
		{"no cluster", server.KubeConfig{Storage: server.StorageKube}, "--storage kube needs --kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			o := baseServerOptions("example.org", t.TempDir())
			o.Kube = tc.o
			_, errs, code := runCLI(t, "", append([]string{"server", "--trust-domain", "example.org", "--data-dir", t.TempDir(), "--grpc-listen", "", "--admin-listen", "127.0.0.1:0"}, kubeArgs(tc.o)...)...)
			assert.NotEqual(t, 0, code)
			assert.Contains(t, errs, tc.want)
		})
	}
}

func kubeArgs(o server.KubeConfig) []string {
	args := []string{"--storage", o.Storage}
	if o.NamespaceSelector != "" {
		args = append(args, "--namespace-selector", o.NamespaceSelector)
	}
	return args
}

// TestKubeReplicas runs two `trustbridge server --storage kube` replicas
// against a real API server: one leader bootstraps the CA into the Secret,
// the follower serves the same bundle and signs with the same root, the
// leader distributes roots to selected namespaces, and when the leader
// stops the follower takes over within about one lease duration and
// repairs the distribution.
func TestKubeReplicas(t *testing.T) {
	env := kubetest.Shared(t)
	// The replicas run as deploy/rbac's service account, with exactly its
	// permissions, in its namespace.
	const ns = "trustbridge-system"
	env.Apply(t, []string{ns}, kubetest.LoadManifests(t, "../../deploy/rbac"))
	servertest.InstallCRD(t, env)
	ctx := context.Background()
	_ = env.Client.CoreV1().Secrets(ns).Delete(ctx, kubestore.DefaultName, metav1.DeleteOptions{})
	_ = env.Client.CoordinationV1().Leases(ns).Delete(ctx, "trustbridge-leader", metav1.DeleteOptions{})
	_ = env.Client.CoreV1().Secrets(ns).Delete(ctx, authn.DefaultLedgerSecret, metav1.DeleteOptions{})
	// The previous leader's saves, as a replica reads them: written here
	// by the test, standing for a save whose watch event came late.
	lkg, err := kubelkg.New(kubelkg.Config{Client: env.Client, Namespace: ns})
	require.NoError(t, err)
	peerTD := spiffeid.RequireTrustDomainFromString("peer.example")
	_ = env.Client.CoreV1().ConfigMaps(ns).Delete(ctx, lkg.Name(peerTD), metav1.DeleteOptions{})
	workloadNS := env.Namespace(t)
	wns, err := env.Client.CoreV1().Namespaces().Get(ctx, workloadNS, metav1.GetOptions{})
	require.NoError(t, err)
	wns.Labels = map[string]string{"trustbridge-test": ns}
	_, err = env.Client.CoreV1().Namespaces().Update(ctx, wns, metav1.UpdateOptions{})
	require.NoError(t, err)

	kubeconfig := servertest.WriteKubeconfig(t, env.Config.Host, env)
	impersonate(t, kubeconfig, "system:serviceaccount:"+ns+":trustbridge")
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(tokens, []byte(servertest.LaptopToken+","+servertest.LaptopID.String()+"\n"), 0o600))
	replica := func() server.Config {
		o := baseServerOptions("example.org", t.TempDir())
		o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff, Kubeconfig: kubeconfig}
		o.Kube = server.KubeConfig{
			Storage: server.StorageKube, Namespace: ns, CASecret: kubestore.DefaultName, LeaderLease: "trustbridge-leader",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond,
			RootConfigMap: distribution.DefaultName, NamespaceSelector: "trustbridge-test=" + ns,
			FederationCRD: true, FederationClass: "replicas",
		}
		// An unreachable peer: only its presence matters here.
		o.Federation.Federate = "peer.example|https://127.0.0.1:9/bundle"
		o.Bundle = server.BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: server.ProfileSPIFFE, ServeOthers: true}
		return o
	}

	adminA, bannerA, stopA := launchServer(t, replica())
	assert.Contains(t, bannerA, "state in Secret "+ns+"/trustbridge-ca")
	assert.NotContains(t, bannerA, "ca issue", "ca issue reads a state directory, not the Secret")
	trustA := servertest.TrustOf(t, adminA)
	require.Len(t, trustA.Authorities, 1, "the first leader bootstrapped one root")

	adminB, bannerB, _ := launchServer(t, replica())
	assert.Equal(t, trustA.Authorities, servertest.TrustOf(t, adminB).Authorities, "the follower serves the leader's roots")
	assert.Equal(t, "1", leaderGauge(t, adminA))
	assert.Equal(t, "0", leaderGauge(t, adminB))

	// The follower is ready once it has the leader's state (the leader's
	// own duties, such as distribution, are not part of it), reports the
	// federation it loads from the leader's saves, and its bundle endpoint
	// serves the same bundle.
	code, body := servertest.Get(t, "http://"+adminB+"/readyz")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, []string{"peer.example"}, servertest.FederatedSequences(t, adminB, nil))
	assert.Equal(t, fetchLocalBundle(t, bannerA), fetchLocalBundle(t, bannerB), "both replicas serve the same bundle")

	// The follower signs with the same root.
	rootCert := filepath.Join(t.TempDir(), "root-cert.pem")
	secret, err := env.Client.CoreV1().Secrets(ns).Get(ctx, kubestore.DefaultName, metav1.GetOptions{})
	require.NoError(t, err)
	var rootPEM []byte
	for k, v := range secret.Data {
		if strings.HasSuffix(k, ".crt.pem") {
			rootPEM = append(rootPEM, v...)
		}
	}
	require.NotEmpty(t, rootPEM)
	require.NoError(t, os.WriteFile(rootCert, rootPEM, 0o644))
	out := t.TempDir()
	_, errs, code := runCLI(t, "", "ca", "request", "--ca-addr", servertest.GRPCAddr(t, bannerB), "--root-cert", rootCert,
		"--token-file", servertest.WriteFile(t, servertest.LaptopToken, 0o600), "--credentials-dir", out)
	require.Equal(t, 0, code, errs)
	checkCreds(t, out, servertest.LaptopID)
	// The token is single-use across replicas: the other one refuses it,
	// from the Secret the first wrote (by reference, never the token)
	// within deploy/rbac's permissions.
	_, errs, code = runCLI(t, "", "ca", "request", "--ca-addr", servertest.GRPCAddr(t, bannerA), "--root-cert", rootCert,
		"--token-file", servertest.WriteFile(t, servertest.LaptopToken, 0o600), "--credentials-dir", t.TempDir())
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "the bootstrap token was already used")
	consumed, err := env.Client.CoreV1().Secrets(ns).Get(ctx, authn.DefaultLedgerSecret, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, consumed.Data, authn.BootstrapGrantRef(sha256.Sum256([]byte(servertest.LaptopToken))))
	for _, v := range consumed.Data {
		assert.NotContains(t, string(v), servertest.LaptopToken)
	}
	for k := range secret.Data {
		assert.NotContains(t, bannerA+bannerB, string(secret.Data[k][:min(40, len(secret.Data[k]))]), "no state in the banner")
	}

	// The leader keeps the roots ConfigMap in the selected namespace.
	cms := env.Client.CoreV1().ConfigMaps(workloadNS)
	require.Eventually(t, func() bool {
		cm, err := cms.Get(ctx, distribution.DefaultName, metav1.GetOptions{})
		return err == nil && cm.Data["root-cert.pem"] == string(rootPEM)
	}, 20*time.Second, 100*time.Millisecond, "root-cert.pem distributed")

	// The CRD controller works within the service account's permissions:
	// it reads resources, the leader writes their status, and a refused
	// one gets an event.
	res := servertest.DynamicClient(t, env).Resource(crd.GVR)
	createCR(t, res, "replicas-crd-peer", map[string]any{"trustDomain": "crd-peer.example", "bundleEndpointURL": "https://127.0.0.1:9/",
		"bundleEndpointProfile": map[string]any{"type": "https_web"}, "className": "replicas"})
	createCR(t, res, "replicas-crd-bad", map[string]any{"trustDomain": "crd-bad.example", "bundleEndpointURL": "https://127.0.0.1:9/",
		"bundleEndpointProfile": map[string]any{"type": "https_web"}, "className": "replicas", "trustDomainBundle": "{not json"})
	require.Eventually(t, func() bool {
		return slices.Contains(servertest.FederatedSequences(t, adminA, nil), "crd-peer.example") && slices.Contains(servertest.FederatedSequences(t, adminB, nil), "crd-peer.example")
	}, 20*time.Second, 100*time.Millisecond, "both replicas apply the resource")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		u, err := res.Get(ctx, "replicas-crd-peer", metav1.GetOptions{})
		require.NoError(c, err)
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		assert.NotEmpty(c, conds, "the leader writes the status")
	}, 20*time.Second, 100*time.Millisecond)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		evs, err := env.Client.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		require.NoError(c, err)
		for _, e := range evs.Items {
			if e.Regarding.Name == "replicas-crd-bad" && e.Reason == crd.ReasonInvalidSpec {
				return
			}
		}
		c.Errorf("no %s event for replicas-crd-bad yet", crd.ReasonInvalidSpec)
	}, 20*time.Second, 100*time.Millisecond, "the refused resource gets an event")

	// A follower refuses an operator refresh: only the leader polls.
	resp, err := http.Post("http://"+adminB+"/v1/federation/refresh?trust_domain=peer.example", "text/plain", nil)
	require.NoError(t, err)
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode, string(msg))
	assert.Contains(t, string(msg), "not the leader")

	// Failover: stop the leader; the follower leads within about a lease
	// duration and shows it by repairing the deleted ConfigMap.
	stopA()
	require.Eventually(t, func() bool { return leaderGauge(t, adminB) == "1" }, 15*time.Second, 100*time.Millisecond, "follower took over")
	require.NoError(t, cms.Delete(ctx, distribution.DefaultName, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, err := cms.Get(ctx, distribution.DefaultName, metav1.GetOptions{})
		return err == nil
	}, 20*time.Second, 100*time.Millisecond, "the new leader restored the ConfigMap")
	assert.Equal(t, trustA.Authorities, servertest.TrustOf(t, adminB).Authorities, "no root was added or lost by the failover")

	// A save the old leader made whose watch event reaches this replica
	// only once it leads (a watch that was down across the failover) is
	// still taken: the new leader must not serve an older federated bundle
	// than the one stored.
	peer := servertest.SPIFFEBundle(t, "peer.example", peerRoot(t, peerTD))
	peer.SetSequenceNumber(7)
	require.NoError(t, lkg.Save(federation.LKGEntry{TrustDomain: peerTD, Bundle: peer,
		EndpointURL: "https://127.0.0.1:9/bundle", FetchedAt: time.Now()}))
	require.Eventually(t, func() bool {
		var seq []uint64
		tds := servertest.FederatedSequences(t, adminB, &seq)
		i := slices.Index(tds, "peer.example")
		return i >= 0 && seq[i] == 7
	}, 20*time.Second, 100*time.Millisecond, "the new leader took the stored bundle")
	_, err = cms.Get(ctx, "unrelated", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err))
}

// fetchLocalBundle fetches the bundle endpoint a server's banner names.
// The endpoint proves itself with an X509-SVID, not a DNS name; what is
// compared here is the document, so the TLS peer is not checked.
func fetchLocalBundle(t *testing.T, banner string) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(servertest.EndpointURL(t, banner))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	return string(body)
}

// peerRoot is a self-signed CA certificate for a peer trust domain.
func peerRoot(t *testing.T, td spiffeid.TrustDomain) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: td.Name()},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs: []*url.URL{td.ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}

// leaderGauge reads trustbridge_leader from the admin listener.
func leaderGauge(t *testing.T, admin string) string {
	t.Helper()
	_, body := servertest.Get(t, "http://"+admin+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "trustbridge_leader{") {
			f := strings.Fields(line)
			return f[len(f)-1]
		}
	}
	return ""
}

// impersonate makes the kubeconfig at path act as user.
func impersonate(t *testing.T, path, user string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	require.NoError(t, err)
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = user
	}
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
}

func createCR(t *testing.T, res dynamic.NamespaceableResourceInterface, name string, spec map[string]any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": crd.Group + "/" + crd.Version, "kind": crd.Kind, "metadata": map[string]any{"name": name}, "spec": spec,
	}}
	_ = res.Delete(context.Background(), name, metav1.DeleteOptions{})
	_, err := res.Create(context.Background(), u, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = res.Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// fastKubeStorage is --storage kube in namespace ns with the default CA
// Secret and leader Lease and leader election timings short enough for
// tests.
func fastKubeStorage(ns string) server.KubeConfig {
	return server.KubeConfig{
		Storage: server.StorageKube, Namespace: ns, CASecret: kubestore.DefaultName, LeaderLease: leader.DefaultName,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond,
	}
}
