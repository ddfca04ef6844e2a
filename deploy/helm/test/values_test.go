package helmtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// testRoot mints a self-signed CA certificate made now, so no checked-in
// certificate expires under the test; uris are its URI names.
func testRoot(t *testing.T, cn string, uris ...*url.URL) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs: uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}

// peerBundle mints west.example's bundle around a testRoot.
func peerBundle(t *testing.T) string {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString("west.example")
	b := spiffebundle.FromX509Authorities(td, []*x509.Certificate{testRoot(t, "west.example test root", td.ID().URL())})
	doc, err := b.Marshal()
	require.NoError(t, err)
	return string(doc)
}

// fullKube is testdata/full-kube.yaml with west.example's bundle in place.
func fullKube(t *testing.T) map[string]any {
	t.Helper()
	v := valuesFile(t, "full-kube.yaml")
	peers := v["federation"].(map[string]any)["peers"].([]any)
	peers[0].(map[string]any)["trustDomainBundle"] = peerBundle(t)
	return v
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	require.Failf(t, "missing object", "%s %s", kind, name)
	return nil
}

// serverConfig is the server's config file as the chart renders it.
func serverConfig(t *testing.T, objs []*unstructured.Unstructured, name string) (string, map[string]any) {
	t.Helper()
	raw, _, err := unstructured.NestedString(find(t, objs, "ConfigMap", name+"-config").Object, "data", "config.yaml")
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(raw), &cfg))
	return raw, cfg
}

// Every value that is a server setting lands on the flag values.yaml names.
func TestValuesSetServerConfig(t *testing.T) {
	values := fullKube(t)
	_, cfg := serverConfig(t, mustRender(t, values), "tb")
	peers := values["federation"].(map[string]any)["peers"]
	want := map[string]any{
		"trust-domain": "east.example", "data-dir": "/var/lib/trustbridge/data",
		"admin-listen": "0.0.0.0:15014", "bundle-listen": "0.0.0.0:8443", "grpc-listen": "0.0.0.0:15012",
		"grpc-dns-names": []any{"tb.trustbridge-system.svc", "ca.east.example"},
		"storage":        "kube", "ca-secret": "east-ca",
		"federation-crd": true, "federation-crd-class": "east", "federation": peers, "trust-policy-crd": true, "identity-map-crd": true,
		"federation-allow-private": true, "federation-allow-empty": true,
		"federation-min-refresh": "45s", "federation-max-refresh": "30m", "federation-timeout": "20s",
		"workload-ttl": "12h", "max-workload-ttl": "48h", "max-renewal-lifetime": "720h",
		"ca-trusted-node-accounts": []any{"istio-system/ztunnel", "kube-system/node-proxy"},
		"ca-response-roots":        "merged", "token-audience": "east.example-ca", "cluster-id": "east",
		"sds-workload-certs": false, "serve-federated": false, "sign-rate-limit": float64(50),
		"root-configmap": "east-roots", "namespace-selector": "trustbridge.dev/inject=true",
		"root-secret": "east-roots", "root-truststore": true, "root-truststore-profile": "Modern2023",
		"root-truststore-password-file": "/etc/trustbridge/truststore-password/storepass",
		"distribution-label":            []any{"team.example/owner=platform"}, "distribution-annotation": []any{"example.com/source=trustbridge"},
		"admin-allowed-hosts": []any{"tb-admin.east-system.svc"},
		"audit-log":           "/var/lib/trustbridge/data/audit.jsonl", "log-format": "text", "log-level": "debug",
		"bundle-refresh-hint": "10m", "sign-queue-size": float64(16384),
	}
	assert.Equal(t, want, cfg)

	_, fileCfg := serverConfig(t, mustRender(t, valuesFile(t, "full-file.yaml")), "trustbridge")
	assert.Equal(t, "file", fileCfg["storage"])
	assert.Equal(t, true, fileCfg["init"], "the first start creates the CA in the claim")
	assert.NotContains(t, fileCfg, "federation-crd")
	assert.NotContains(t, fileCfg, "trust-policy-crd")
	assert.NotContains(t, fileCfg, "identity-map-crd")
}

// The server itself accepts every config file the chart renders: each key
// is one of its flags, each value one it takes (`trustbridge config check`
// reads the file exactly as the server does).
func TestServerAcceptsRenderedConfig(t *testing.T) {
	bin := os.Getenv("TRUSTBRIDGE_BIN")
	if bin == "" {
		if os.Getenv(kubetest.RequireEnv) == "require" {
			t.Fatalf("TRUSTBRIDGE_BIN required (%s=require): make helm-tests sets it to bin/trustbridge", kubetest.RequireEnv)
		}
		t.Skip("TRUSTBRIDGE_BIN not set (make helm-tests sets it)")
	}
	cases := map[string]map[string]any{
		"base":              baseValues(),
		"full-kube":         fullKube(t),
		"full-file":         valuesFile(t, "full-file.yaml"),
		"file-claim":        valuesFile(t, "file-claim.yaml"),
		"upstream-kube-csr": upstreamKubeCSR(t, signerRootPEM(t)),
		"agent":             valuesFile(t, "agent.yaml"),
		"agent-default":     agentValues(true),
		"platform":          valuesFile(t, "platform.yaml"),
		"pod-identity":      valuesFile(t, "pod-identity.yaml"),
		"pod-certificates":  podIdentity(t, true, false),
		"trust-bundles":     podIdentity(t, false, true),
	}
	for name, values := range cases {
		t.Run(name, func(t *testing.T) {
			objs := mustRender(t, values)
			release := "trustbridge"
			if n, ok := values["fullnameOverride"].(string); ok {
				release = n
			} else if n, ok := values["nameOverride"].(string); ok {
				release += "-" + n
			}
			raw, _ := serverConfig(t, objs, release)
			// The truststore password is a Secret mounted into the pod;
			// here a file of the test's stands for it.
			password := filepath.Join(t.TempDir(), "storepass")
			require.NoError(t, os.WriteFile(password, []byte("changeit\n"), 0o600))
			raw = strings.ReplaceAll(raw, "/etc/trustbridge/truststore-password/storepass", password)
			path := filepath.Join(t.TempDir(), "config.yaml")
			require.NoError(t, os.WriteFile(path, []byte(raw), 0o600))
			cmd := exec.Command(bin, "config", "check", path)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
			out, err := cmd.CombinedOutput()
			assert.NoError(t, err, "trustbridge config check:\n%s\n%s", out, raw)
		})
	}
}

// Values that are Kubernetes fields land on them.
func TestValuesSetObjects(t *testing.T) {
	objs := mustRender(t, fullKube(t))
	dep := find(t, objs, "Deployment", "tb")
	pod, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
	c := pod["containers"].([]any)[0].(map[string]any)
	assert.Equal(t, "registry.example/trustbridge@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", c["image"], "a digest wins over the tag")
	assert.Equal(t, "Always", c["imagePullPolicy"])
	replicas, _, _ := unstructured.NestedFieldNoCopy(dep.Object, "spec", "replicas")
	assert.EqualValues(t, 3, replicas)
	assert.Equal(t, "system-cluster-critical", pod["priorityClassName"])
	assert.Equal(t, map[string]any{"kubernetes.io/os": "linux"}, pod["nodeSelector"])
	assert.NotEmpty(t, pod["tolerations"])
	assert.NotEmpty(t, pod["affinity"])
	assert.Equal(t, []any{map[string]any{"name": "registry-credentials"}}, pod["imagePullSecrets"])
	assert.Equal(t, "tb", pod["serviceAccountName"])
	ann, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "annotations")
	assert.Equal(t, "security", ann["example.com/team"])
	assert.Len(t, ann["checksum/config"], 64, "a config change rolls the pods")
	mem, _, _ := unstructured.NestedString(c, "resources", "limits", "memory")
	assert.Equal(t, "512Mi", mem)

	svcType, _, _ := unstructured.NestedString(find(t, objs, "Service", "tb-bundle").Object, "spec", "type")
	assert.Equal(t, "LoadBalancer", svcType)
	minAvail, _, _ := unstructured.NestedFieldNoCopy(find(t, objs, "PodDisruptionBudget", "tb").Object, "spec", "minAvailable")
	assert.EqualValues(t, 2, minAvail)
	assert.NotContains(t, kinds(objs), "NetworkPolicy")
	assert.Empty(t, find(t, objs, "CustomResourceDefinition", "clusterfederatedtrustdomains.trustbridge.dev").GetAnnotations(), "crds.keep=false")

	// RBAC and the admission policy follow the names the server uses.
	rules, _, _ := unstructured.NestedSlice(find(t, objs, "Role", "tb").Object, "rules")
	assert.Equal(t, []any{"east-ca"}, rules[0].(map[string]any)["resourceNames"])
	rules, _, _ = unstructured.NestedSlice(find(t, objs, "ClusterRole", "tb").Object, "rules")
	assert.Equal(t, []any{"east-roots"}, rules[1].(map[string]any)["resourceNames"])
	vap := find(t, objs, "ValidatingAdmissionPolicy", "tb-configmap-create")
	cond, _, _ := unstructured.NestedSlice(vap.Object, "spec", "matchConditions")
	assert.Contains(t, cond[0].(map[string]any)["expression"], `"system:serviceaccount:trustbridge-system:tb"`)
	val, _, _ := unstructured.NestedSlice(vap.Object, "spec", "validations")
	assert.Contains(t, val[0].(map[string]any)["expression"], `variables.name == "east-roots"`)

	// The ServiceMonitor scrapes the admin port through its own Service.
	sm := find(t, objs, "ServiceMonitor", "tb")
	assert.Equal(t, "prometheus", sm.GetLabels()["release"])
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	admin := find(t, objs, "Service", "tb-admin")
	for k, v := range sel {
		assert.Equal(t, v, admin.GetLabels()[k], "the ServiceMonitor selects the admin Service (label %s)", k)
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	assert.Equal(t, map[string]any{"port": "admin", "path": "/metrics", "scheme": "http", "interval": "15s", "scrapeTimeout": "10s"}, eps[0])
}

func kinds(objs []*unstructured.Unstructured) []string {
	var k []string
	for _, o := range objs {
		k = append(k, o.GetKind())
	}
	return k
}

// File storage: one replica that never overlaps its successor, the data
// directory on a claim, no PodDisruptionBudget to block drains forever.
func TestFileStorage(t *testing.T) {
	objs := mustRender(t, valuesFile(t, "full-file.yaml"))
	dep := find(t, objs, "Deployment", "trustbridge")
	strategy, _, _ := unstructured.NestedString(dep.Object, "spec", "strategy", "type")
	assert.Equal(t, "Recreate", strategy)
	policy, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "securityContext", "fsGroupChangePolicy")
	assert.Equal(t, "OnRootMismatch", policy)
	vols, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
	assert.Contains(t, vols, map[string]any{"name": "data", "persistentVolumeClaim": map[string]any{"claimName": "trustbridge-data"}})
	pvc := find(t, objs, "PersistentVolumeClaim", "trustbridge-data")
	assert.Equal(t, "keep", pvc.GetAnnotations()["helm.sh/resource-policy"], "uninstalling keeps the CA")
	class, _, _ := unstructured.NestedString(pvc.Object, "spec", "storageClassName")
	assert.Equal(t, "fast-ssd", class)
	size, _, _ := unstructured.NestedString(pvc.Object, "spec", "resources", "requests", "storage")
	assert.Equal(t, "5Gi", size)
	assert.NotContains(t, kinds(objs), "PodDisruptionBudget")
	assert.NotContains(t, kinds(objs), "CustomResourceDefinition", "crds.install=false")
	// Least privilege: no Secrets, Leases or distribution without kube
	// storage, no CRD access without federation.crd; token reviews stay.
	for _, kind := range []string{"Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		assert.NotContains(t, kinds(objs), kind)
	}
	rules, _, _ := unstructured.NestedSlice(find(t, objs, "ClusterRole", "trustbridge").Object, "rules")
	var resources []any
	for _, r := range rules {
		resources = append(resources, r.(map[string]any)["resources"].([]any)...)
	}
	assert.ElementsMatch(t, []any{"tokenreviews", "serviceaccounts", "pods"}, resources)

	objs = mustRender(t, valuesFile(t, "file-claim.yaml"))
	assert.NotContains(t, kinds(objs), "PersistentVolumeClaim")
	vols, _, _ = unstructured.NestedSlice(find(t, objs, "Deployment", "trustbridge").Object, "spec", "template", "spec", "volumes")
	assert.Contains(t, vols, map[string]any{"name": "data", "persistentVolumeClaim": map[string]any{"claimName": "trustbridge-state"}})
}

// Values the server would refuse, or that would deploy something broken,
// fail rendering with a message naming the value and the fix.
func TestBadValuesFail(t *testing.T) {
	with := func(base map[string]any, set func(v map[string]any)) map[string]any {
		set(base)
		return base
	}
	fileStorage := func() map[string]any { return valuesFile(t, "full-file.yaml") }
	cases := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"no trust domain", map[string]any{}, "trustDomain is required"},
		{"trust domain with a scheme", map[string]any{"trustDomain": "spiffe://example.org"}, "trustDomain"},
		{"file storage with 2 replicas", with(fileStorage(), func(v map[string]any) { v["replicas"] = 2 }),
			"replicas is 2 but storage.type=file holds the CA state in one replica's volume"},
		{"federation CRD with file storage", with(fileStorage(), func(v map[string]any) { v["federation"] = map[string]any{"crd": true} }),
			"federation.crd needs storage.type=kube"},
		{"trust policy CRD with file storage", with(fileStorage(), func(v map[string]any) { v["trustPolicy"] = map[string]any{"crd": true} }),
			"trustPolicy.crd needs storage.type=kube"},
		{"CA Secret with file storage", with(fileStorage(), func(v map[string]any) { v["storage"].(map[string]any)["caSecret"] = "x" }),
			"storage.caSecret names the CA Secret of kube storage"},
		{"kube-csr without a signer", with(upstreamKubeCSR(t, signerRootPEM(t)), func(v map[string]any) {
			v["upstream"].(map[string]any)["kubeCSR"].(map[string]any)["signerName"] = ""
		}), "upstream.kubeCSR.enabled needs upstream.kubeCSR.signerName"},
		{"kube-csr with a built-in signer", with(upstreamKubeCSR(t, signerRootPEM(t)), func(v map[string]any) {
			v["upstream"].(map[string]any)["kubeCSR"].(map[string]any)["signerName"] = "kubernetes.io/kube-apiserver-client"
		}), "the built-in kubernetes.io signers never issue CA certificates"},
		{"kube-csr without roots", upstreamKubeCSR(t, ""), "upstream.kubeCSR.enabled needs upstream.kubeCSR.roots"},
		{"kube-csr roots not PEM", upstreamKubeCSR(t, "corp root"), "upstream.kubeCSR.enabled needs upstream.kubeCSR.roots"},
		{"kube-csr values while off", with(baseValues(), func(v map[string]any) {
			v["upstream"] = map[string]any{"kubeCSR": map[string]any{"signerName": "example.com/x"}}
		}), "upstream.kubeCSR values are set but upstream.kubeCSR.enabled is false"},
		{"kube-csr through extraConfig", with(baseValues(), func(v map[string]any) { v["extraConfig"] = map[string]any{"upstream": "kube-csr"} }),
			"set upstream.kubeCSR.enabled=true instead"},
		{"kube-csr roots through extraConfig", with(baseValues(), func(v map[string]any) { v["extraConfig"] = map[string]any{"upstream-kube-roots": "/x.pem"} }),
			"extraConfig.upstream-kube-roots is set by the chart"},
		{"kube-csr signer name not a path", with(upstreamKubeCSR(t, signerRootPEM(t)), func(v map[string]any) {
			v["upstream"].(map[string]any)["kubeCSR"].(map[string]any)["signerName"] = "Example"
		}), "signerName"},
		{"unknown storage", with(baseValues(), func(v map[string]any) { v["storage"] = map[string]any{"type": "s3"} }), "at '/storage/type': value must be one of 'kube', 'file'"},
		{"zero replicas", with(baseValues(), func(v map[string]any) { v["replicas"] = 0 }), "replicas"},
		{"misspelt value", with(baseValues(), func(v map[string]any) { v["trustDomian"] = "x" }), "trustDomian"},
		{"peer without a profile", with(baseValues(), func(v map[string]any) {
			v["federation"] = map[string]any{"peers": []any{map[string]any{"trustDomain": "a.example", "bundleEndpointURL": "https://a.example/"}}}
		}), "bundleEndpointProfile"},
		{"peer over http", with(baseValues(), func(v map[string]any) {
			v["federation"] = map[string]any{"peers": []any{map[string]any{"trustDomain": "a.example", "bundleEndpointURL": "http://a.example/",
				"bundleEndpointProfile": map[string]any{"type": "https_web"}}}}
		}), "bundleEndpointURL"},
		{"bad duration", with(baseValues(), func(v map[string]any) { v["policy"] = map[string]any{"maxWorkloadTTL": "3 days"} }), "maxWorkloadTTL"},
		{"chart-owned key in extraConfig", with(baseValues(), func(v map[string]any) { v["extraConfig"] = map[string]any{"ca-secret": "other"} }),
			"extraConfig.ca-secret is set by the chart"},
		{"pod certificates with file storage", with(fileStorage(), func(v map[string]any) { v["podIdentity"] = podIdentity(t, true, false)["podIdentity"] }),
			"podIdentity needs storage.type=kube"},
		{"trust bundles with file storage", with(fileStorage(), func(v map[string]any) { v["podIdentity"] = podIdentity(t, false, true)["podIdentity"] }),
			"podIdentity needs storage.type=kube"},
		{"pod certificates without a signer", with(podIdentity(t, true, false), func(v map[string]any) { v["podIdentity"].(map[string]any)["signerName"] = "" }),
			"podIdentity needs podIdentity.signerName"},
		{"trust bundles without a signer", with(podIdentity(t, false, true), func(v map[string]any) { v["podIdentity"].(map[string]any)["signerName"] = "" }),
			"podIdentity needs podIdentity.signerName"},
		{"pod certificates without namespaces", with(podIdentity(t, true, true), func(v map[string]any) {
			v["podIdentity"].(map[string]any)["podCertificates"].(map[string]any)["namespaces"] = " "
		}), "podIdentity.podCertificates.enabled needs podIdentity.podCertificates.namespaces"},
		{"pod certificate namespaces while off", with(podIdentity(t, false, true), func(v map[string]any) {
			v["podIdentity"].(map[string]any)["podCertificates"].(map[string]any)["namespaces"] = "a=b"
		}), "podIdentity.podCertificates.namespaces is set but podIdentity.podCertificates.enabled is false"},
		{"signer while both off", with(podIdentity(t, false, false), func(v map[string]any) {}),
			"podIdentity.signerName is set but neither"},
		{"kubernetes.io signer", with(podIdentity(t, true, true), func(v map[string]any) {
			v["podIdentity"].(map[string]any)["signerName"] = "kubernetes.io/kube-apiserver-client"
		}), "signer names under kubernetes.io/ are Kubernetes' own"},
		{"signer name without a path", with(podIdentity(t, false, true), func(v map[string]any) { v["podIdentity"].(map[string]any)["signerName"] = "trustbridge.io" }),
			"at '/podIdentity/signerName'"},
		{"signer domain of one label", with(podIdentity(t, false, true), func(v map[string]any) { v["podIdentity"].(map[string]any)["signerName"] = "trustbridge/svid" }),
			"at '/podIdentity/signerName'"},
		{"pod certificate signer through extraConfig", with(baseValues(), func(v map[string]any) {
			v["extraConfig"] = map[string]any{"pod-certificate-signer": "trustbridge.io/svid"}
		}), "extraConfig.pod-certificate-signer is set by the chart"},
		{"trust bundle signer through extraConfig", with(baseValues(), func(v map[string]any) {
			v["extraConfig"] = map[string]any{"cluster-trust-bundle-signer": "trustbridge.io/svid"}
		}), "extraConfig.cluster-trust-bundle-signer is set by the chart"},
		{"extraConfig repeating a value", with(baseValues(), func(v map[string]any) {
			v["policy"] = map[string]any{"workloadTTL": "1h"}
			v["extraConfig"] = map[string]any{"workload-ttl": "2h"}
		}), "extraConfig.workload-ttl is already set by a chart value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.values)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The agent's rendered arguments are flags the binary has: it parses them
// all (with --help, so that it starts nothing), every value the chart
// sets included.
func TestAgentAcceptsRenderedArgs(t *testing.T) {
	bin := os.Getenv("TRUSTBRIDGE_BIN")
	if bin == "" {
		if os.Getenv(kubetest.RequireEnv) == "require" {
			t.Fatalf("TRUSTBRIDGE_BIN required (%s=require): make helm-tests sets it to bin/trustbridge", kubetest.RequireEnv)
		}
		t.Skip("TRUSTBRIDGE_BIN not set (make helm-tests sets it)")
	}
	for name, values := range map[string]map[string]any{"agent": valuesFile(t, "agent.yaml"), "agent-default": agentValues(true)} {
		t.Run(name, func(t *testing.T) {
			objs := mustRender(t, values)
			var args []string
			for _, o := range objs {
				if o.GetKind() != "DaemonSet" {
					continue
				}
				cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
				for _, c := range cs {
					a, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
					if len(a) > 0 && a[0] == "agent" {
						args = a
					}
				}
			}
			require.NotEmpty(t, args, "no agent container rendered")
			cmd := exec.Command(bin, append(args, "--help")...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
			out, err := cmd.CombinedOutput()
			assert.NoError(t, err, "trustbridge %v:\n%s", args, out)
		})
	}
}
