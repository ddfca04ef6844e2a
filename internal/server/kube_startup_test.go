package server

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/ca/kubestore"
	"github.com/trustbridge/trustbridge/internal/datadir"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// An error after the Kubernetes parts started (here: --bundle-listen on
// a port in use) stops them: runServer returns the error, the Lease is
// released for the next replica, and no goroutine is left behind.
func TestKubeEarlyReturnStopsBackground(t *testing.T) {
	kenv := kubetest.Shared(t)
	ns := kenv.Namespace(t)
	kubeconfig := servertest.WriteKubeconfig(t, kenv.Config.Host, kenv)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()

	o := baseServerOptions("example.org", t.TempDir())
	o.GRPC = GRPCConfig{Kubeconfig: kubeconfig, TokenReview: TokenReviewOff}
	o.Bundle = BundleConfig{Listen: busy.Addr().String(), Path: "/", Profile: ProfileSPIFFE}
	o.Kube = fastKubeStorage(ns)

	leaks := goleak.IgnoreCurrent()
	var out, logs testlog.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = runServer(ctx, env{in: strings.NewReader(""), out: &out, err: &logs, now: time.Now}, o, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--bundle-listen")
	assert.Contains(t, logs.String(), "leading", "the kube parts had started: this replica led")

	lease, err := kenv.Client.CoordinationV1().Leases(ns).Get(context.Background(), "trustbridge-leader", metav1.GetOptions{})
	require.NoError(t, err)
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	assert.Empty(t, holder, "the Lease is released on the way out")
	_, err = kenv.Client.CoreV1().Secrets(ns).Get(context.Background(), kubestore.DefaultName, metav1.GetOptions{})
	require.NoError(t, err, "the leader bootstrapped the CA before the error")

	goleak.VerifyNone(t, leaks,
		// client-go's pooled connections to the API server idle on.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// A replica stopped (SIGTERM) while it waits for a first leader to
// bootstrap the CA exits cleanly, like a running one, and leaves the
// Lease it never held alone.
func TestKubeStopWhileWaitingForALeader(t *testing.T) {
	kenv := kubetest.Shared(t)
	ns := kenv.Namespace(t)
	kubeconfig := servertest.WriteKubeconfig(t, kenv.Config.Host, kenv)
	// Another replica holds the Lease and never writes the CA state.
	holder, dur, now := "someone-else", int32(3600), metav1.NewMicroTime(time.Now())
	_, err := kenv.Client.CoordinationV1().Leases(ns).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "trustbridge-leader", Namespace: ns},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	o := baseServerOptions("example.org", t.TempDir())
	o.GRPC = GRPCConfig{Kubeconfig: kubeconfig, TokenReview: TokenReviewOff}
	o.Kube = fastKubeStorage(ns)
	leaks := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, logs testlog.Buffer
	err = runServer(ctx, env{in: strings.NewReader(""), out: &out, err: &logs, now: time.Now}, o, nil)
	assert.NoError(t, err, "a stop is not a failure\n%s", logs.String())
	assert.Empty(t, out.String(), "never served")

	lease, err := kenv.Client.CoordinationV1().Leases(ns).Get(context.Background(), "trustbridge-leader", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, lease.Spec.HolderIdentity)
	assert.Equal(t, holder, *lease.Spec.HolderIdentity)
	goleak.VerifyNone(t, leaks,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

func TestKubeNamespace(t *testing.T) {
	for _, tc := range []struct {
		name, flag, env, want, wantErr string
	}{
		{name: "flag wins", flag: "a", env: "b", want: "a"},
		{name: "POD_NAMESPACE", env: "b", want: "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", tc.env)
			got, err := kubeNamespace(tc.flag)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	if _, err := os.Stat(serviceAccountNamespaceFile); err != nil {
		t.Run("none", func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", "")
			_, err := kubeNamespace("")
			assert.EqualError(t, err, "--storage kube needs --namespace (or env POD_NAMESPACE, or running in a pod)")
		})
	}
}

// With --storage kube the data directory holds no CA (issue 21 item 3):
// a missing one is created without --init, 0700, and locked like any
// other, so replicas that get a fresh emptyDir on every start need no
// flag that would also let a file-storage server start a new CA.
func TestKubeStorageCreatesItsDataDirWithoutInit(t *testing.T) {
	kenv := kubetest.Shared(t)
	ns := kenv.Namespace(t)
	kubeconfig := servertest.WriteKubeconfig(t, kenv.Config.Host, kenv)
	dataDir := filepath.Join(t.TempDir(), "data")
	o := baseServerOptions("example.org", dataDir)
	o.GRPC = GRPCConfig{Kubeconfig: kubeconfig, TokenReview: TokenReviewOff}
	o.Kube = fastKubeStorage(ns)
	admin, banner, _ := launchServer(t, o)
	assert.Contains(t, banner, "state in Secret "+ns+"/trustbridge-ca")
	assert.Len(t, servertest.TrustOf(t, admin).Authorities, 1)
	info, err := os.Stat(dataDir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), info.Mode().Perm())
	holder, held, err := datadir.Probe(dataDir)
	require.NoError(t, err)
	assert.True(t, held, "the replica holds its data directory")
	assert.Equal(t, os.Getpid(), holder.PID)
	_, err = os.Stat(filepath.Join(dataDir, "ca"))
	assert.ErrorIs(t, err, os.ErrNotExist, "no CA state on disk")
}

// The state Secret of another trust domain is sound state found by a
// wrong flag: the refusal names the Secret, both trust domains and the
// flags that fix it, not corruption.
func TestKubeRefusesOtherTrustDomainState(t *testing.T) {
	kenv := kubetest.Shared(t)
	ns := kenv.Namespace(t)
	kubeconfig := servertest.WriteKubeconfig(t, kenv.Config.Host, kenv)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	start := func(td string) error {
		o := baseServerOptions(td, t.TempDir())
		o.GRPC = GRPCConfig{Kubeconfig: kubeconfig, TokenReview: TokenReviewOff}
		o.Bundle = BundleConfig{Listen: busy.Addr().String(), Path: "/", Profile: ProfileSPIFFE}
		o.Kube = fastKubeStorage(ns)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out, logs testlog.Buffer
		return runServer(ctx, env{in: strings.NewReader(""), out: &out, err: &logs, now: time.Now}, o, nil)
	}
	// The first start writes example.org's CA into the Secret, then fails
	// on the busy --bundle-listen.
	require.ErrorContains(t, start("example.org"), "--bundle-listen")
	err = start("other.org")
	require.Error(t, err)
	assert.Equal(t, "Secret "+ns+"/"+kubestore.DefaultName+" (--ca-secret in --namespace) holds the CA of trust domain example.org; "+
		"this server was started with --trust-domain other.org: use --trust-domain example.org, or another --ca-secret or --namespace", err.Error())
}
