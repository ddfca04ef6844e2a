package istiotest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	meshconfig "istio.io/api/mesh/v1alpha1"
	_ "istio.io/istio/pilot/cmd/pilot-agent/options" // registers pilot-agent's environment variables
	_ "istio.io/istio/pilot/pkg/features"            // registers istiod's
	"istio.io/istio/pkg/env"
	"istio.io/istio/pkg/spiffe"
	"sigs.k8s.io/yaml"
)

// docCommandBlocks are the guide's shell blocks that need a cluster: their
// trustbridge commands are checked against the binary's --help, the files
// they name against the guide's YAML blocks. The local-* blocks run.
var docCommandBlocks = []string{"cluster-install", "istio-install", "cluster-check", "federation-check", "node-install", "authz-apply", "troubleshoot"}

// docYAMLBlocks are the guide's YAML files, each checked by a test below.
var docYAMLBlocks = []string{"trustbridge-config.yaml", "istio-values.yaml", "istio-own-roots.yaml", "istio-node-values.yaml", "authz-federated.yaml"}

// TestIstioDocBlocks: every block of the guide is one a test knows, and
// every trustbridge command in it names a real subcommand and real flags.
func TestIstioDocBlocks(t *testing.T) {
	bin := trustbridgeBinary(t)
	blocks := readDocBlocks(t)
	known := append(append([]string{"local-setup", "local-server", "local-agent", "local-verify"}, docCommandBlocks...), docYAMLBlocks...)
	for name, b := range blocks {
		assert.Contains(t, known, name, "%s:%d: no test checks block %q", istioDoc, b.line, name)
	}
	help := newHelpCache(bin)
	for _, name := range append([]string{"local-setup", "local-server", "local-agent", "local-verify"}, docCommandBlocks...) {
		b := block(t, blocks, name, "sh")
		t.Run(name, func(t *testing.T) {
			for _, line := range commandLines(b.body) {
				for _, words := range shellSegments(t, line) {
					checkCommand(t, help, line, words)
				}
			}
		})
	}
}

// checkCommand checks one trustbridge, helm or kubectl command of the guide.
func checkCommand(t *testing.T, help *helpCache, line string, words []string) {
	t.Helper()
	switch strings.TrimPrefix(words[0], "(") {
	case "trustbridge":
		cmd, flags := help.command(t, words[1:])
		for _, w := range words[1:] {
			if name, ok := flagName(w); ok {
				assert.Contains(t, flags, name, "%q: trustbridge %s has no flag --%s", line, cmd, name)
			}
		}
		if cmd == "config check" {
			assert.Contains(t, docYAMLBlocks, words[len(words)-1], "%q checks a file the guide does not show", line)
		}
	case "helm":
		i := slices.Index(words, "-f")
		require.Positive(t, i, "%q: helm without -f VALUES", line)
		for ; i >= 0 && i+1 < len(words); i = nextIndex(words, i, "-f") {
			assertDocOrRepoFile(t, line, words[i+1])
		}
	case "kubectl":
		for i := nextIndex(words, -1, "-f"); i >= 0 && i+1 < len(words); i = nextIndex(words, i, "-f") {
			assertDocOrRepoFile(t, line, words[i+1])
		}
		if i := slices.Index(words, "-k"); i >= 0 && i+1 < len(words) && strings.HasPrefix(words[i+1], "deploy/") {
			_, err := os.Stat(filepath.Join(repoRoot, words[i+1], "kustomization.yaml"))
			assert.NoError(t, err, "%q: no kustomization in the repository at %s", line, words[i+1])
		}
	}
}

// repoRoot is the repository's root, relative to this package.
const repoRoot = "../../.."

// nextIndex is the index of the next word w after index i, or -1.
func nextIndex(words []string, i int, w string) int {
	if j := slices.Index(words[i+1:], w); j >= 0 {
		return i + 1 + j
	}
	return -1
}

// assertDocOrRepoFile: a file a command of the guide reads is one of its
// YAML blocks, or a file of the repository (deploy/...).
func assertDocOrRepoFile(t *testing.T, line, file string) {
	t.Helper()
	if strings.HasPrefix(file, "deploy/") {
		_, err := os.Stat(filepath.Join(repoRoot, file))
		assert.NoError(t, err, "%q: no such file in the repository", line)
		return
	}
	assert.Contains(t, docYAMLBlocks, file, "%q: file not in the guide", line)
}

// flagName is the long flag a word names, without its value.
func flagName(w string) (string, bool) {
	if !strings.HasPrefix(w, "--") || len(w) == 2 {
		return "", false
	}
	name, _, _ := strings.Cut(w[2:], "=")
	return name, true
}

// helpCache runs `trustbridge CMD --help` once per command.
type helpCache struct {
	bin  string
	seen map[string]string
}

func newHelpCache(bin string) *helpCache { return &helpCache{bin: bin, seen: map[string]string{}} }

func (h *helpCache) text(t *testing.T, cmd []string) string {
	t.Helper()
	key := strings.Join(cmd, " ")
	if s, ok := h.seen[key]; ok {
		return s
	}
	out, err := exec.Command(h.bin, append(slices.Clone(cmd), "--help")...).CombinedOutput()
	require.NoError(t, err, "trustbridge %s --help: %s", key, out)
	h.seen[key] = string(out)
	return string(out)
}

var (
	helpFlag    = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`)
	helpCommand = regexp.MustCompile(`(?m)^  ([a-z][a-z0-9-]*)\s{2,}\S`)
)

// command finds the subcommand args name (the longest path of listed
// subcommands) and returns it with every flag it takes.
func (h *helpCache) command(t *testing.T, args []string) (string, []string) {
	t.Helper()
	var path []string
	for _, a := range args {
		text := h.text(t, path)
		_, subs, _ := strings.Cut(text, "Available Commands:")
		subs, _, _ = strings.Cut(subs, "\n\n")
		var names []string
		for _, m := range helpCommand.FindAllStringSubmatch(subs, -1) {
			names = append(names, m[1])
		}
		if !slices.Contains(names, a) {
			break
		}
		path = append(path, a)
	}
	require.NotEmpty(t, path, "trustbridge %v: no such command", args)
	var flags []string
	for _, m := range helpFlag.FindAllStringSubmatch(h.text(t, path), -1) {
		flags = append(flags, m[1])
	}
	return strings.Join(path, " "), flags
}

// TestIstioDocConfig: the guide's trustbridge config passes `trustbridge
// config check` and agrees with its Istio values.
func TestIstioDocConfig(t *testing.T) {
	bin := trustbridgeBinary(t)
	blocks := readDocBlocks(t)
	cfgBlock := block(t, blocks, "trustbridge-config.yaml", "yaml")
	dir := docDir(t)
	file := filepath.Join(dir, cfgBlock.name)
	require.NoError(t, os.WriteFile(file, []byte(cfgBlock.body), 0o600))
	out, err := exec.Command(bin, "config", "check", file).CombinedOutput()
	require.NoError(t, err, "trustbridge config check %s:\n%s", cfgBlock.name, out)

	var cfg struct {
		TrustDomain   string   `json:"trust-domain"`
		GRPCListen    string   `json:"grpc-listen"`
		GRPCDNSNames  []string `json:"grpc-dns-names"`
		TokenAudience string   `json:"token-audience"`
		ClusterID     string   `json:"cluster-id"`
		RootConfigMap string   `json:"root-configmap"`
		ResponseRoots string   `json:"ca-response-roots"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(cfgBlock.body), &cfg))
	values := docValues(t, blocks, "istio-values.yaml")
	chart := chartDefaults(t, "istio-control/istio-discovery")

	caAddr := lookup(t, values, "global.caAddress").(string)
	host, port, err := net.SplitHostPort(caAddr)
	require.NoError(t, err, "global.caAddress")
	assert.Contains(t, cfg.GRPCDNSNames, host, "Istio's client checks the CA's certificate for the host of global.caAddress (CA_ADDR)")
	assert.Equal(t, port, portOfListen(t, cfg.GRPCListen), "global.caAddress's port is not grpc-listen's")
	assert.Equal(t, lookup(t, values, "meshConfig.trustDomain"), cfg.TrustDomain, "meshConfig.trustDomain")
	assert.Equal(t, lookup(t, chart, "global.sds.token.aud"), cfg.TokenAudience, "the proxies' token audience (global.sds.token.aud's default)")
	assert.Equal(t, "Kubernetes", cfg.ClusterID, "the injector's ISTIO_META_CLUSTER_ID when global.multiCluster.clusterName is empty")
	assert.Equal(t, lookup(t, chart, "global.multiCluster.clusterName"), "", "the chart's default cluster name changed")
	assert.Equal(t, "local", cfg.ResponseRoots, "merged would make sidecars trust federated roots for the local trust domain")
	assertRootMounted(t, values, cfg.RootConfigMap)
}

// assertRootMounted: CA_ROOT_CA is root-cert.pem of a volume of the
// injection template that holds trustbridge's ConfigMap, and that template
// is one the injector applies by default.
func assertRootMounted(t *testing.T, values map[string]any, configMap string) {
	t.Helper()
	rootFile := lookup(t, values, "meshConfig.defaultConfig.proxyMetadata.CA_ROOT_CA").(string)
	templates := lookup(t, values, "sidecarInjectorWebhook.templates").(map[string]any)
	defaults := lookup(t, values, "sidecarInjectorWebhook.defaultTemplates").([]any)
	require.Contains(t, defaults, "sidecar", "defaultTemplates replaces the injector's default: keep sidecar")
	var pod struct {
		Spec struct {
			Containers []struct {
				Name         string `json:"name"`
				VolumeMounts []struct {
					Name      string `json:"name"`
					MountPath string `json:"mountPath"`
					ReadOnly  bool   `json:"readOnly"`
				} `json:"volumeMounts"`
			} `json:"containers"`
			Volumes []struct {
				Name      string `json:"name"`
				ConfigMap struct {
					Name string `json:"name"`
				} `json:"configMap"`
			} `json:"volumes"`
		} `json:"spec"`
	}
	found := false
	for name, tmpl := range templates {
		require.NoError(t, yaml.UnmarshalStrict([]byte(tmpl.(string)), &pod), "template %s", name)
		for _, c := range pod.Spec.Containers {
			for _, m := range c.VolumeMounts {
				for _, v := range pod.Spec.Volumes {
					if c.Name == "istio-proxy" && v.Name == m.Name && v.ConfigMap.Name == configMap &&
						path.Join(m.MountPath, "root-cert.pem") == rootFile {
						found = true
						assert.Contains(t, defaults, name, "template %s is not applied by default", name)
					}
				}
			}
		}
	}
	assert.True(t, found, "no template mounts ConfigMap %s's root-cert.pem at CA_ROOT_CA %s in istio-proxy", configMap, rootFile)
}

// TestIstioDocValues: every key of the guide's Helm values is one Istio's
// chart has (meshConfig by its proto, strictly; env and proxyMetadata by
// Istio's registered environment variables).
func TestIstioDocValues(t *testing.T) {
	blocks := readDocBlocks(t)
	chart := chartDefaults(t, "istio-control/istio-discovery")
	for _, name := range []string{"istio-values.yaml", "istio-own-roots.yaml", "istio-node-values.yaml"} {
		t.Run(name, func(t *testing.T) {
			values := docValues(t, blocks, name)
			for key, v := range values {
				switch key {
				case "meshConfig":
					mc := strictMeshConfig(t, v)
					for k := range mc.GetDefaultConfig().GetProxyMetadata() {
						assert.True(t, istioEnv(k), "proxyMetadata %s is not an environment variable Istio's agent reads", k)
					}
				case "env":
					for k := range v.(map[string]any) {
						assert.True(t, istioEnv(k), "env %s is not an environment variable istiod reads", k)
					}
				default:
					assertChartKeys(t, chart, key, v)
				}
			}
		})
	}
}

// TestIstioDocOwnRoots: the spiffeBundleUrl the guide gives istiod, served
// by trustbridge's https_web endpoint at that path, gives Istio's own
// fetcher (pkg/spiffe, what istiod's trust bundle polls with) exactly the
// roots trustbridge publishes for its trust domain.
func TestIstioDocOwnRoots(t *testing.T) {
	bin := trustbridgeBinary(t)
	blocks := readDocBlocks(t)
	values := docValues(t, blocks, "istio-own-roots.yaml")
	mc := strictMeshConfig(t, values["meshConfig"])
	require.Len(t, mc.GetCaCertificates(), 1)
	entry := mc.GetCaCertificates()[0]
	assert.Empty(t, entry.GetTrustDomains(), "istiod's fetched roots are the mesh's own trust domain's only")
	u, err := url.Parse(entry.GetSpiffeBundleUrl())
	require.NoError(t, err)
	require.Equal(t, "https", u.Scheme)
	assert.False(t, strings.HasPrefix(u.Path, "/bundles/") || u.Path == "/bundle-map", "the URL must be the local bundle, not a relayed one")

	dir := docDir(t)
	pool, certFile, keyFile := webCert(t, dir)
	srv := startServerIn(t, bin, dir, "--trust-domain", mc.GetTrustDomain(), "--data-dir", "data", "--init",
		"--admin-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--bundle-listen", "127.0.0.1:0",
		"--bundle-profile", "https_web", "--bundle-tls-cert", certFile, "--bundle-tls-key", keyFile,
		"--bundle-path", u.Path)
	require.NotEmpty(t, srv.bundleURL, "no bundle: line in the banner")
	served, err := url.Parse(srv.bundleURL)
	require.NoError(t, err)
	local := "https://" + net.JoinHostPort("127.0.0.1", served.Port()) + u.Path

	roots, err := spiffe.RetrieveSpiffeBundleRootCerts(map[string]string{mc.GetTrustDomain(): local}, pool, 5*time.Second)
	require.NoError(t, err, "Istio's fetcher on trustbridge's https_web endpoint at %s", local)
	var got []string
	for _, c := range roots[mc.GetTrustDomain()] {
		sum := sha256.Sum256(c.Raw)
		got = append(got, hex.EncodeToString(sum[:]))
	}
	var want []string
	for _, a := range srv.trust(t).Authorities {
		want = append(want, a.SHA256)
	}
	assert.ElementsMatch(t, want, got)
}

// TestIstioDocNames: every flag, Istio environment variable and Helm value
// the guide's prose names in backquotes exists.
func TestIstioDocNames(t *testing.T) {
	bin := trustbridgeBinary(t)
	doc, err := os.ReadFile(istioDoc)
	require.NoError(t, err)
	help := newHelpCache(bin)
	var flags []string
	for _, cmd := range [][]string{{"server"}, {"agent"}, {"ca", "request"}, {"ca", "issue"}, {"audit"}, {"federation", "status"}, {"bundle", "inspect"}, {"token", "create"}} {
		_, f := help.command(t, cmd)
		flags = append(flags, f...)
	}
	chart := chartDefaults(t, "istio-control/istio-discovery")
	envName := regexp.MustCompile(`^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$`)
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(string(doc), -1) {
		word, _, _ := strings.Cut(m[1], " ")
		word, _, _ = strings.Cut(word, "=")
		switch {
		case strings.HasPrefix(word, "--"):
			assert.Contains(t, flags, strings.TrimPrefix(word, "--"), "%s names a flag no trustbridge command has", word)
		case envName.MatchString(word):
			assert.True(t, istioEnv(word), "%s is not an environment variable Istio registers", word)
		case strings.HasPrefix(word, "meshConfig."):
			assertProtoPath(t, (&meshconfig.MeshConfig{}).ProtoReflect().Descriptor(), strings.TrimPrefix(word, "meshConfig."))
		case strings.HasPrefix(word, "global.") || strings.HasPrefix(word, "sidecarInjectorWebhook."):
			lookup(t, chart, word)
		}
	}
}

// istioEnv reports whether Istio (pilot-agent's options, istiod's
// features) registers the environment variable name.
func istioEnv(name string) bool {
	for _, v := range env.VarDescriptions() {
		if v.Name == name {
			return true
		}
	}
	return false
}

// assertProtoPath checks a dotted path of JSON field names against a
// message (a map's key ends the walk).
func assertProtoPath(t *testing.T, md protoreflect.MessageDescriptor, p string) {
	t.Helper()
	for _, part := range strings.Split(p, ".") {
		require.NotNil(t, md, "%s: %s is not a message", p, part)
		f := md.Fields().ByJSONName(part)
		require.NotNil(t, f, "%s: %s has no field %s", p, md.FullName(), part)
		if f.IsMap() {
			return
		}
		md = f.Message()
	}
}

func strictMeshConfig(t *testing.T, v any) *meshconfig.MeshConfig {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	mc := &meshconfig.MeshConfig{}
	require.NoError(t, protojson.Unmarshal(b, mc), "meshConfig is not a valid MeshConfig")
	return mc
}

// assertChartKeys checks that every leaf key of v under key exists in the
// chart's defaults (a free map, such as templates, ends the walk).
func assertChartKeys(t *testing.T, chart map[string]any, key string, v any) {
	t.Helper()
	def := lookup(t, chart, key)
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	dm, ok := def.(map[string]any)
	require.True(t, ok, "%s is not a map in the chart", key)
	if len(dm) == 0 {
		return
	}
	for k, sub := range m {
		assertChartKeys(t, chart, key+"."+k, sub)
	}
}

// lookup returns the value at a dotted path, failing when it is absent.
func lookup(t *testing.T, m map[string]any, p string) any {
	t.Helper()
	var cur any = m
	for _, part := range strings.Split(p, ".") {
		cm, ok := cur.(map[string]any)
		require.True(t, ok, "%s: not a map before %s", p, part)
		cur, ok = cm[part]
		require.True(t, ok, "%s: no key %s in Istio's chart values or the guide's", p, part)
	}
	return cur
}

func docValues(t *testing.T, blocks map[string]docBlock, name string) map[string]any {
	t.Helper()
	var v map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(block(t, blocks, name, "yaml").body), &v), name)
	return v
}

// chartDefaults reads a chart's values.yaml from the pinned istio.io/istio
// module: its defaults are under _internal_defaults_do_not_set.
func chartDefaults(t *testing.T, chart string) map[string]any {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio").Output()
	require.NoError(t, err, "go list -m istio.io/istio")
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "manifests", "charts", chart, "values.yaml"))
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, yaml.Unmarshal(b, &v))
	d, ok := v["_internal_defaults_do_not_set"].(map[string]any)
	require.True(t, ok, "%s/values.yaml has no _internal_defaults_do_not_set", chart)
	return d
}

func portOfListen(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return port
}

// webCert mints a Web PKI CA and a serving certificate for 127.0.0.1,
// returning the CA as a pool and the certificate and key files.
func webCert(t *testing.T, dir string) (*x509.CertPool, string, string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "doc test web CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "web.crt"), filepath.Join(dir, "web.key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, certFile, keyFile
}
