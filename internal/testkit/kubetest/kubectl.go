package kubetest

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Kubectl runs the kubectl `make kube-tools` builds next to kube-apiserver,
// the same binary users run: deploy/'s tests render kustomizations and run
// `kubectl apply --dry-run=server` with it.
type Kubectl struct {
	t testing.TB
	// Bin is kubectl's path.
	Bin string
	// Kubeconfig names the API server; empty for commands that need none
	// (kubectl kustomize).
	Kubeconfig string
}

// OfflineKubectl returns kubectl without an API server. It skips the test
// when kubectl is missing, or fails it under RequireEnv=require.
func OfflineKubectl(t testing.TB) *Kubectl {
	t.Helper()
	path := filepath.Join(AssetsDir(), "kubectl")
	if _, err := os.Stat(path); err != nil {
		if os.Getenv(RequireEnv) == "require" {
			t.Fatalf("kubectl required (%s=require) but missing: %v (run make kube-tools)", RequireEnv, err)
		}
		t.Skipf("no kubectl (run make kube-tools): %v", err)
	}
	return &Kubectl{t: t, Bin: path}
}

// Kubectl returns kubectl talking to this API server as a cluster admin,
// through a kubeconfig in the test's temporary directory.
func (e *Env) Kubectl(t testing.TB) *Kubectl {
	t.Helper()
	k := OfflineKubectl(t)
	k.Kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := e.writeKubeconfig(k.Kubeconfig); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	return k
}

// Run runs kubectl with stdin and returns its standard output, or on
// failure its standard output and error together.
func (k *Kubectl) Run(stdin []byte, args ...string) (string, error) {
	k.t.Helper()
	if k.Kubeconfig != "" {
		args = append([]string{"--kubeconfig", k.Kubeconfig}, args...)
	}
	cmd := exec.Command(k.Bin, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

// Must is Run that fails the test on an error.
func (k *Kubectl) Must(stdin []byte, args ...string) string {
	k.t.Helper()
	out, err := k.Run(stdin, args...)
	if err != nil {
		k.t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// DecodeObjects decodes a stream of YAML or JSON manifests, skipping empty
// documents.
func DecodeObjects(t testing.TB, manifests string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	for {
		var u unstructured.Unstructured
		err := d.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("kubetest: manifests do not decode: %v", err)
		}
		if len(u.Object) > 0 {
			out = append(out, &u)
		}
	}
}
