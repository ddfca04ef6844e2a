package main

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/trustbridge/trustbridge/ca/kubestore"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/trustpolicy/policycrd"
	"github.com/trustbridge/trustbridge/sds"
)

const (
	crdPayToken = "crd-payments-bootstrap-token-0123456789"
	crdOpsToken = "crd-ops-bootstrap-token-0123456789abc"
	crdEastPeer = "spiffe://east.example/ns/billing/sa/api"
)

var (
	crdPay = spiffeid.RequireFromString("spiffe://west.example/ns/payments/sa/api")
	crdOps = spiffeid.RequireFromString("spiffe://west.example/ns/ops/sa/batch")
)

// The whole --trust-policy-crd path against the real API server: a
// ClusterTrustPolicy granting east.example (peer ns/billing/sa/api only)
// to ns/payments reaches the SDS streams of west's workloads through the
// controller, the Combiner and the server's gate. payments' ALL carries
// east with the peer as a URI SAN matcher, ops' spiffe://east.example is
// the explicit denial; editing the resource to grant ops too pushes east
// to its stream; deleting it brings back the default (allow: every
// workload trusts east, with no SAN matcher). The resource's status says
// it is applied and which workloads it matched, and each change is in the
// audit log with source "crd", once each. No restart at any point, and
// the server keeps serving once the resources were read.
//
// ClusterTrustPolicy is cluster-scoped: every server with
// --trust-policy-crd on the shared API server applies this resource, so
// its name carries the test's namespace and it grants west.example's
// workloads only.
func TestKubeTrustPolicyCRD(t *testing.T) {
	env := kubetest.Shared(t)
	installPolicyCRD(t, env)
	dyn := servertest.DynamicClient(t, env)
	ns := env.Namespace(t)

	eastData, eastRoots := bootstrapDataDir(t, "east.example")
	eastAddr := servertest.ReservePort(t)
	startE2EServer(t, "east.example", eastData, func(o *server.Config) { o.Bundle.Listen = eastAddr })

	o := baseServerOptions("west.example", t.TempDir())
	o.Federation.ConfigFile = servertest.WriteSPIFFEFederationConfig(t, "east.example", eastAddr, eastRoots)
	o.Federation.MinRefresh = time.Second
	o.Federation.AllowPrivate = true
	tokens := servertest.WriteTokenFile(t, crdPayToken+","+crdPay.String()+",reusable\n"+crdOpsToken+","+crdOps.String()+",reusable\n")
	o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff,
		Kubeconfig: servertest.WriteKubeconfig(t, env.Config.Host, env)}
	o.Kube = fastKubeStorage(ns)
	o.Kube.TrustPolicyCRD = true
	admin, banner, _ := launchServer(t, o)
	west := &e2eServer{td: spiffeid.RequireTrustDomainFromString("west.example"), dataDir: o.DataDir, admin: "http://" + admin, banner: banner}
	waitFederated(t, west, "east.example", 1, 30*time.Second)
	westRoots := kubeCARoots(t, env, ns)

	res := dyn.Resource(policycrd.GVR)
	name := "payments-to-east-" + ns
	grant := func(workloads ...string) map[string]any {
		var ws []any
		for _, w := range workloads {
			ws = append(ws, map[string]any{"spiffeID": w})
		}
		return map[string]any{"workloads": ws, "trustDomains": []any{
			map[string]any{"name": "east.example", "peers": []any{crdEastPeer}},
		}}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": policycrd.Group + "/" + policycrd.Version, "kind": policycrd.Kind,
		"metadata": map[string]any{"name": name}, "spec": grant("spiffe://west.example/ns/payments/*"),
	}}
	_, err := res.Create(context.Background(), u, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = res.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	cr := waitPolicyStatus(t, res, name, func(c *assert.CollectT, cr policycrd.ClusterTrustPolicy) {
		cond := meta.FindStatusCondition(cr.Status.Conditions, policycrd.ConditionReady)
		if assert.NotNil(c, cond, "no Ready condition: %+v", cr.Status) {
			assert.Equal(c, metav1.ConditionTrue, cond.Status, "%+v", cond)
			assert.Equal(c, policycrd.ReasonApplied, cond.Reason, "%+v", cond)
		}
	})
	assert.Equal(t, []string{"east.example"}, cr.Status.TrustDomains)

	addr := servertest.GRPCAddr(t, banner)
	pay := openEnvoy(t, dialSDSTLS(t, addr, west.td, westRoots, crdPayToken), nil, sds.AllName, partnerName)
	got := pay.recvAcked(10*time.Second, nil)
	names, roots := spiffeValidator(t, got[sds.AllName])
	assert.Equal(t, []string{"east.example", "west.example"}, names)
	sameCerts(t, eastRoots, roots["east.example"], "payments trusts east's roots")
	assert.ElementsMatch(t, []string{"exact:" + crdEastPeer, "prefix:spiffe://west.example/"}, sans(got[sds.AllName]))
	assert.Equal(t, []string{"exact:" + crdEastPeer}, sans(got[partnerName]))

	ops := openEnvoy(t, dialSDSTLS(t, addr, west.td, westRoots, crdOpsToken), nil, sds.AllName, partnerName)
	got = ops.recvAcked(10*time.Second, nil)
	names, _ = spiffeValidator(t, got[sds.AllName])
	assert.Equal(t, []string{"west.example"}, names, "ops may not trust east")
	assertDenied(t, got[partnerName])

	// Granting ops too reaches its open stream.
	cur, err := res.Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	cur.Object["spec"] = grant("spiffe://west.example/ns/payments/*", crdOps.String())
	_, err = res.Update(context.Background(), cur, metav1.UpdateOptions{})
	require.NoError(t, err)
	got = ops.recvAcked(30*time.Second, hasTrustDomain(t, "east.example"))
	assert.ElementsMatch(t, []string{"exact:" + crdEastPeer, "prefix:spiffe://west.example/"}, sans(got[sds.AllName]))
	assert.Equal(t, []string{"exact:" + crdEastPeer}, sans(got[partnerName]))
	sameCerts(t, eastRoots, trustedCA(t, got[partnerName]), "ops now receives east's roots, not the denial")

	// The edit's status names payments among the workloads matched (its
	// stream was decided before the edit was synced).
	waitPolicyStatus(t, res, name, func(c *assert.CollectT, cr policycrd.ClusterTrustPolicy) {
		assert.Equal(c, cur.GetGeneration()+1, cr.Status.ObservedGeneration)
		if assert.NotNil(c, cr.Status.MatchedWorkloads, "%+v", cr.Status) {
			assert.GreaterOrEqual(c, cr.Status.MatchedWorkloads.Count, int64(1))
			assert.Contains(c, cr.Status.MatchedWorkloads.Recent, crdPay.String())
		}
	})

	// Deleted: no rule governs east.example any more, and the default
	// (allow) gives it to everyone, with no peer restriction.
	require.NoError(t, res.Delete(context.Background(), name, metav1.DeleteOptions{}))
	for _, s := range []*envoy{pay, ops} {
		got = s.recvAcked(30*time.Second, func(got map[string]*tlsv3.Secret) bool { return len(sans(got[sds.AllName])) == 0 })
		names, roots = spiffeValidator(t, got[sds.AllName])
		assert.Equal(t, []string{"east.example", "west.example"}, names)
		sameCerts(t, eastRoots, roots["east.example"], "east's roots under the default")
		assert.Empty(t, sans(got[partnerName]))
		sameCerts(t, eastRoots, trustedCA(t, got[partnerName]), "east's roots under the default")
	}

	// Create, edit and delete are each an audited change from "crd". The
	// streams hear of a change before its audit entry is written, so the
	// third entry naming the rule is waited for (whole lines only).
	rule := policycrd.RuleName(name)
	auditPath := filepath.Join(o.DataDir, "audit.jsonl")
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		data, err := os.ReadFile(auditPath)
		if !assert.NoError(c, err) {
			return
		}
		n := 0
		for _, line := range strings.SplitAfter(string(data), "\n") {
			if strings.HasSuffix(line, "\n") && strings.Contains(line, server.EventPolicyChanged) && strings.Contains(line, rule) {
				n++
			}
		}
		assert.GreaterOrEqual(c, n, 3)
	}, 30*time.Second, 50*time.Millisecond)
	var crd []string
	for _, e := range servertest.PolicyEvents(t, auditPath) {
		if e.Event == server.EventPolicyChanged && e.Policy != nil && e.Policy.Source == server.CRDPolicySource {
			crd = append(crd, strings.Join(e.Policy.RulesAdded, ",")+"|"+strings.Join(e.Policy.RulesChanged, ",")+"|"+strings.Join(e.Policy.RulesRemoved, ","))
		}
	}
	assert.Equal(t, []string{rule + "||", "|" + rule + "|", "||" + rule}, crd)
}

// installPolicyCRD installs deploy/base's ClusterTrustPolicy CRD.
func installPolicyCRD(t *testing.T, env *kubetest.Env) {
	t.Helper()
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join("..", "..", "deploy", "base", "trustpolicy-crd.yaml")}, ErrorIfPathMissing: true,
	})
	require.NoError(t, err)
}

// kubeCARoots reads the roots of the CA a --storage kube server keeps in
// ns's Secret: what a workload is handed out of band to trust its server.
func kubeCARoots(t *testing.T, env *kubetest.Env, ns string) []*x509.Certificate {
	t.Helper()
	secret, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), kubestore.DefaultName, metav1.GetOptions{})
	require.NoError(t, err)
	var roots []*x509.Certificate
	for k, v := range secret.Data {
		if strings.HasSuffix(k, ".crt.pem") {
			certs, err := cli.ParsePEMCerts(v)
			require.NoError(t, err)
			roots = append(roots, certs...)
		}
	}
	require.NotEmpty(t, roots)
	return roots
}

// waitPolicyStatus waits until the resource's status passes check and
// returns it.
func waitPolicyStatus(t *testing.T, res dynamic.NamespaceableResourceInterface, name string, check func(*assert.CollectT, policycrd.ClusterTrustPolicy)) policycrd.ClusterTrustPolicy {
	t.Helper()
	var cr policycrd.ClusterTrustPolicy
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, err := res.Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(c, err)
		cr = policycrd.ClusterTrustPolicy{}
		require.NoError(c, runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &cr))
		check(c, cr)
	}, 45*time.Second, 100*time.Millisecond)
	return cr
}

// hasTrustDomain is true of a response whose ALL trusts td.
func hasTrustDomain(t *testing.T, td string) func(map[string]*tlsv3.Secret) bool {
	return func(got map[string]*tlsv3.Secret) bool {
		names, _ := spiffeValidator(t, got[sds.AllName])
		for _, n := range names {
			if n == td {
				return true
			}
		}
		return false
	}
}

// recvAcked acknowledges responses until one passes until (any, when nil)
// and returns it decoded. Responses before it (a federation refresh, a
// push of an intermediate state) are acknowledged and skipped.
func (e *envoy) recvAcked(timeout time.Duration, until func(map[string]*tlsv3.Secret) bool) map[string]*tlsv3.Secret {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := e.recv(time.Until(deadline))
		got := secrets(e.t, r)
		e.ack(r)
		if until == nil || until(got) {
			return got
		}
	}
}
