package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/federation/distribution"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// TestKubeClusterTrustBundlesE2E: with --cluster-trust-bundle-signer the
// leader keeps a ClusterTrustBundle of its own roots and one of each
// federated trust domain's, which a pod selects by our signer name and the
// trust domain label; a peer added at run time appears, and disappears
// when it is removed.
func TestKubeClusterTrustBundlesE2E(t *testing.T) {
	env := kubetest.Shared(t)
	servertest.InstallCRD(t, env)
	dyn := servertest.DynamicClient(t, env)
	eastData, eastRoots := bootstrapDataDir(t, "east.example")
	east := startE2EServer(t, "east.example", eastData, nil)
	eastPEM := writeTemp(t, mustCLI(t, "bundle", "show", "-o", "pem", "--data-dir", eastData))

	westData := t.TempDir()
	signer := "e2e.trustbridge.test/svid"
	o := baseServerOptions("west.example", westData)
	o.GRPC.Kubeconfig = servertest.WriteKubeconfig(t, env.Config.Host, env)
	o.Kube = fastKubeStorage(env.Namespace(t))
	o.Kube.FederationCRD, o.Kube.FederationClass = true, "ctb-e2e"
	o.Kube.TrustBundleSigner = signer
	o.Federation.AllowPrivate = true
	admin, _, _ := launchServer(t, o)
	west := "http://" + admin
	t.Cleanup(func() {
		_ = dyn.Resource(crd.GVR).Delete(context.Background(), "east.example", metav1.DeleteOptions{})
		_ = env.Client.CertificatesV1beta1().ClusterTrustBundles().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.signerName", signer).String()})
	})

	parseRoots := func(c require.TestingT, s string) []*x509.Certificate {
		var roots []*x509.Certificate
		rest := []byte(s)
		for {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				return roots
			}
			cert, err := x509.ParseCertificate(block.Bytes)
			require.NoError(c, err)
			roots = append(roots, cert)
		}
	}
	podView := func(c *assert.CollectT, td string) []*x509.Certificate {
		l, err := env.Client.CertificatesV1beta1().ClusterTrustBundles().List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.signerName", signer).String(),
			LabelSelector: labels.SelectorFromSet(labels.Set{distribution.TrustDomainLabel: td}).String(),
		})
		require.NoError(c, err)
		var roots []*x509.Certificate
		for _, b := range l.Items {
			roots = append(roots, parseRoots(c, b.Spec.TrustBundle)...)
		}
		return roots
	}
	holds := func(td string, want []*x509.Certificate) {
		t.Helper()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := podView(c, td)
			require.Len(c, got, len(want), "roots of %s", td)
			for i := range want {
				assert.True(c, got[i].Equal(want[i]), "root %d of %s", i, td)
			}
		}, 30*time.Second, 100*time.Millisecond)
	}
	// With --storage kube the CA is the Secret's, made at this start.
	westRoots := parseRoots(t, mustCLI(t, "bundle", "show", "-o", "pem", "--admin", west))
	require.NotEmpty(t, westRoots)
	holds("west.example", westRoots)

	_, stderr, code := runCLIAt(t, time.Now, "", "federation", "add", "east.example", east.bundleURL,
		"--endpoint-spiffe-id", "spiffe://east.example/trustbridge/bundle-endpoint", "--bundle", eastPEM, "--admin", west, "--data-dir", westData)
	require.Equal(t, 0, code, stderr)
	holds("east.example", eastRoots)

	_, stderr, code = runCLIAt(t, time.Now, "", "federation", "remove", "east.example", "--admin", west, "--data-dir", westData)
	require.Equal(t, 0, code, stderr)
	holds("east.example", nil)
	holds("west.example", westRoots)
}
