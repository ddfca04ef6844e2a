// Package kubetest runs tests against a real kube-apiserver backed by etcd,
// started on loopback by controller-runtime's envtest from binaries built
// by `make kube-tools` (bin/kube: kube-apiserver and kube-controller-manager
// from the pinned k8s.io/kubernetes module in internal/testkit/kubetest/tools, etcd
// from Debian).
//
// A package's tests share one API server, started on first use:
//
//	func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		env := kubetest.Shared(t)
//		ns := env.Namespace(t)
//		...
//	}
//
// Without the binaries the tests skip, unless TRUSTBRIDGE_KUBE_TESTS=require
// (set by `make test`), which turns a missing or failing API server into a
// test failure: CI must never pass by skipping this tier.
//
// No kube-controller-manager runs by default: service accounts are created
// by hand, nothing is garbage collected, and deleted namespaces stay
// Terminating. A test that needs Kubernetes' built-in CSR signers starts
// one running only its CSR signing controller (Env.CSRSigner).
//
// The tests of a custom resource's controller share crd.go: the CRD
// installed once (Env.InstallCRD), resources from YAML, a wait for a
// resource's Ready condition, and, for unit tests that drive a sync by
// hand, a fake dynamic client and a Lister on it.
package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// RequireEnv, when "require", makes a missing API server a failure.
const RequireEnv = "TRUSTBRIDGE_KUBE_TESTS"

// AssetsEnv names the folder holding kube-apiserver and etcd (envtest's
// own variable).
const AssetsEnv = "KUBEBUILDER_ASSETS"

// Env is a running API server.
type Env struct {
	// Config authenticates as a cluster admin.
	Config *rest.Config
	// Client is built from Config.
	Client kubernetes.Interface

	mu   sync.Mutex
	crds map[string]error // InstallCRD's, by path
}

var shared struct {
	once sync.Once
	env  *Env
	te   *envtest.Environment
	err  error
}

// Main runs the package's tests and then stops the shared API server, if
// one was started. Use it from TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	if shared.te != nil {
		if err := shared.te.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "kubetest: stopping the API server:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Tests is m with Main's ending, for goleak.VerifyTestMain (which takes
// anything with a Run method and exits itself): goroutines are looked for
// once the shared API server, and every connection to it, is gone.
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(kubetest.Tests(m)) }
func Tests(m *testing.M) interface{ Run() int } { return mainTests{m} }

type mainTests struct{ m *testing.M }

func (t mainTests) Run() int { return Main(t.m) }

// Shared returns the test binary's API server, starting it on first use.
func Shared(t testing.TB) *Env {
	t.Helper()
	shared.once.Do(func() { shared.env, shared.te, shared.err = start() })
	if shared.err != nil {
		if os.Getenv(RequireEnv) == "require" {
			t.Fatalf("kubetest: real API server required (%s=require) but unavailable: %v", RequireEnv, shared.err)
		}
		t.Skipf("kubetest: no real API server (run `make kube-tools`, or set %s): %v", AssetsEnv, shared.err)
	}
	return shared.env
}

// AssetsDir is where the binaries are looked for: $KUBEBUILDER_ASSETS, else
// bin/kube at the top of the repository.
func AssetsDir() string {
	if d := os.Getenv(AssetsEnv); d != "" {
		return d
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "bin", "kube")
}

func start() (*Env, *envtest.Environment, error) {
	dir := AssetsDir()
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return nil, nil, fmt.Errorf("%s not found in %s: %w", name, dir, err)
		}
	}
	// envtest logs through controller-runtime's logger, which otherwise
	// prints a stack trace complaining that nobody set it.
	ctrllog.SetLogger(logr.Discard())
	te := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	// The API server advertises the address it serves on, as a real one
	// does: its service account issuer discovery names jwks_uri on the
	// advertised address, which otherwise defaults to this host's first
	// non-loopback address, where nothing listens.
	api := te.ControlPlane.GetAPIServer().Configure()
	api.Set("advertise-address", "127.0.0.1")
	// Kubernetes' own pod identity, beta and off by default in 1.35:
	// ClusterTrustBundles and PodCertificateRequests (KEP-3257, KEP-4317).
	api.Set("feature-gates", "ClusterTrustBundle=true,PodCertificateRequest=true")
	api.Set("runtime-config", "certificates.k8s.io/v1beta1/clustertrustbundles=true,certificates.k8s.io/v1beta1/podcertificaterequests=true")
	// envtest reads KUBEBUILDER_ASSETS over BinaryAssetsDirectory; both
	// name the same folder here.
	cfg, err := te.Start()
	if err != nil {
		_ = te.Stop()
		return nil, nil, fmt.Errorf("start kube-apiserver and etcd: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 200, 400
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		_ = te.Stop()
		return nil, nil, err
	}
	return &Env{Config: cfg, Client: client}, te, nil
}

// Namespace creates a namespace with a fresh name for this test and deletes
// it when the test ends.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "test-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}

// ServiceAccountToken creates service account ns/sa if it does not exist and
// returns a token for it from the TokenRequest API. The API server refuses
// lifetimes under 10 minutes.
func (e *Env) ServiceAccountToken(t testing.TB, ns, sa string, audiences []string, ttl time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubetest: create service account %s/%s: %v", ns, sa, err)
	}
	secs := int64(ttl / time.Second)
	tr, err := e.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: token for %s/%s: %v", ns, sa, err)
	}
	if tr.Status.Token == "" {
		t.Fatal(errors.New("kubetest: API server returned an empty token"))
	}
	return tr.Status.Token
}

// SlowWrites returns a copy of e.Config whose requests with one of methods
// (e.g. PUT, POST) are held until delay has passed or the request is
// cancelled: an API server that answers writes late.
func (e *Env) SlowWrites(delay time.Duration, methods ...string) *rest.Config {
	cfg := rest.CopyConfig(e.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if slices.Contains(methods, r.Method) {
				select {
				case <-r.Context().Done():
					return nil, r.Context().Err()
				case <-time.After(delay):
				}
			}
			return rt.RoundTrip(r)
		})
	})
	return cfg
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
