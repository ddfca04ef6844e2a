package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// serveOn serves gs on a unix socket at path until the test ends.
func serveOn(t *testing.T, gs *grpc.Server, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
}

func TestRunAlreadyServing(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "socket")
	ca := testca.New(t, tdA.Name())
	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{x509bundle.FromX509Authorities(tdA, nil)}))
	srv, err := sds.New(sds.Config{TrustDomain: tdA, Trust: trust, Authenticator: authn.AuthenticatorFunc(
		func(context.Context, authn.Request) (authn.Identity, error) {
			return authn.Identity{ID: workload, Method: localMethod}, nil
		})})
	require.NoError(t, err)
	gs := grpc.NewServer()
	srv.Register(gs)
	serveOn(t, gs, sock)
	// Files are present too: step 1 wins over step 2.
	writeCreds(t, dir, ca, workload, ca.Cert)

	a := newTestAgent(t, Config{SocketPath: sock, CredentialsDir: dir})
	err = a.Run(context.Background())
	require.ErrorIs(t, err, ErrAlreadyServing)
	assert.Contains(t, err.Error(), sock)
	fi, err := os.Lstat(sock)
	require.NoError(t, err, "the live server's socket stays")
	assert.Equal(t, os.ModeSocket, fi.Mode().Type())
}

// streamOnlySDS answers SDS streams with an empty response and refuses
// FetchSecrets, as Istio's agent does.
type streamOnlySDS struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer
}

func (streamOnlySDS) StreamSecrets(st grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
		if err := st.Send(&discoveryv3.DiscoveryResponse{TypeUrl: resourcev3.SecretType}); err != nil {
			return err
		}
	}
}

func TestRunAlreadyServingStreamOnly(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "socket")
	gs := grpc.NewServer()
	secretv3.RegisterSecretDiscoveryServiceServer(gs, streamOnlySDS{})
	serveOn(t, gs, sock)
	ca := testca.New(t, tdA.Name())
	writeCreds(t, dir, ca, workload, ca.Cert)

	err := newTestAgent(t, Config{SocketPath: sock, CredentialsDir: dir}).Run(context.Background())
	require.ErrorIs(t, err, ErrAlreadyServing)
}

func TestRunOtherGRPCServerKept(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "socket")
	gs := grpc.NewServer() // no SDS: Unimplemented
	serveOn(t, gs, sock)
	ca := testca.New(t, tdA.Name())
	writeCreds(t, dir, ca, workload, ca.Cert)

	err := newTestAgent(t, Config{SocketPath: sock, CredentialsDir: dir}).Run(context.Background())
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrAlreadyServing)
	assert.Contains(t, err.Error(), "without SDS")
	_, err = os.Lstat(sock)
	require.NoError(t, err)
}

func TestRunRefusesNonSocket(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string)
	}{
		{"regular file", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte("keep me"), 0o600))
		}},
		{"directory", func(t *testing.T, path string) {
			require.NoError(t, os.Mkdir(path, 0o700))
		}},
		{"symlink to a socket", func(t *testing.T, path string) {
			target := path + ".real"
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: target, Net: "unix"})
			require.NoError(t, err)
			ln.SetUnlinkOnClose(false)
			require.NoError(t, ln.Close())
			require.NoError(t, os.Symlink(target, path))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := shortDir(t)
			sock := filepath.Join(dir, "socket")
			tt.setup(t, sock)
			before, err := os.Lstat(sock)
			require.NoError(t, err)
			ca := testca.New(t, tdA.Name())
			writeCreds(t, dir, ca, workload, ca.Cert)

			err = newTestAgent(t, Config{SocketPath: sock, CredentialsDir: dir}).Run(context.Background())
			require.Error(t, err)
			assert.Contains(t, err.Error(), "not a socket")
			after, err := os.Lstat(sock)
			require.NoError(t, err)
			assert.True(t, os.SameFile(before, after), "the path is untouched")
		})
	}
}

func TestRunReplacesStaleSocket(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string)
	}{
		{"nobody listens", func(t *testing.T, path string) {
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			require.NoError(t, err)
			ln.SetUnlinkOnClose(false)
			require.NoError(t, ln.Close())
		}},
		{"listener that does not speak gRPC", func(t *testing.T, path string) {
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			require.NoError(t, err)
			ln.SetUnlinkOnClose(false)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					defer c.Close()
				}
			}()
			t.Cleanup(func() { ln.Close(); <-done })
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := shortDir(t)
			sock := filepath.Join(dir, "socket")
			tt.setup(t, sock)
			before, err := os.Lstat(sock)
			require.NoError(t, err)
			ca := testca.New(t, tdA.Name())
			leaf := writeCreds(t, dir, ca, workload, ca.Cert)

			a := newTestAgent(t, Config{SocketPath: sock, CredentialsDir: dir})
			stop, done := runAgent(t, a)
			waitUnlessEnded(t, done, func() bool {
				fi, err := os.Lstat(sock)
				return err == nil && !os.SameFile(before, fi)
			})
			got := collect(t, mustStream(t, sock, sds.DefaultName), hasAll(sds.DefaultName), sds.DefaultName)
			assert.Equal(t, leaf.Raw, leafOf(t, got[sds.DefaultName]).Raw)
			require.NoError(t, stop())
		})
	}
}

func mustStream(t *testing.T, sock string, names ...string) sotw {
	t.Helper()
	s, cancel := openStream(t, socketClient(t, sock), names...)
	t.Cleanup(cancel)
	return s
}

func TestRunFiles(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "uds", "socket")
	creds := filepath.Join(dir, "creds")
	require.NoError(t, os.Mkdir(creds, 0o700))
	caA := testca.New(t, tdA.Name())
	caB := testca.New(t, tdB.Name())
	leaf1 := writeCreds(t, creds, caA, workload, caA.Cert, caB.Cert)

	reg := prometheus.NewRegistry()
	a := newTestAgent(t, Config{SocketPath: sock, CredentialsDir: creds, PollInterval: 10 * time.Millisecond, Registerer: reg})
	stop, done := runAgent(t, a)
	waitSocket(t, sock, done)

	fi, err := os.Stat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	dfi, err := os.Stat(filepath.Dir(sock))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o750), dfi.Mode().Perm())

	names := []string{sds.DefaultName, sds.RootCAName, sds.AllName}
	s := mustStream(t, sock, names...)
	got := collect(t, s, hasAll(names...), names...)
	assert.Equal(t, leaf1.Raw, leafOf(t, got[sds.DefaultName]).Raw)
	roots, err := parseRootsSource(got[sds.RootCAName].GetValidationContext().GetTrustedCa())
	require.NoError(t, err)
	require.Len(t, roots, 1)
	assert.Equal(t, caA.Cert.Raw, roots[0].Raw)
	assert.Equal(t, []string{"a.test", "b.test"}, trustDomainsOf(t, got[sds.AllName]))

	// A new certificate is pushed.
	leaf2 := writeCreds(t, creds, caA, workload, caA.Cert, caB.Cert)
	collect(t, s, func(m map[string]*tlsv3.Secret) bool {
		return m[sds.DefaultName] != nil && string(leafOf(t, m[sds.DefaultName]).Raw) == string(leaf2.Raw)
	}, names...)

	// Half written (a new chain, the old key) and garbage keep the last
	// good credential, visibly.
	// (Counted from what the counter holds now: a poll that fell between
	// writeCreds' two files above may already have counted a failure.)
	fail := a.metrics.fileReloads.WithLabelValues(resultFailure)
	leaf3, _ := caA.Issue(t, workload)
	before := testutil.ToFloat64(fail)
	writeFile(t, filepath.Join(creds, CertChainFile), pemCerts(leaf3))
	require.Eventually(t, func() bool { return testutil.ToFloat64(fail) == before+1 }, 5*time.Second, 5*time.Millisecond)
	writeFile(t, filepath.Join(creds, KeyFile), []byte("not a key"))
	require.Eventually(t, func() bool { return testutil.ToFloat64(fail) == before+2 }, 5*time.Second, 5*time.Millisecond)
	resp, err := socketClient(t, sock).FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{
		TypeUrl: resourcev3.SecretType, ResourceNames: []string{sds.DefaultName},
	})
	require.NoError(t, err)
	assert.Equal(t, leaf2.Raw, leafOf(t, secretsOf(t, resp)[sds.DefaultName]).Raw)

	// Another identity is refused too. The roots stay as they are, so
	// that the files, written one at a time, pass through no state but
	// the garbage key's and the final one: a reload that caught the chain
	// and key before the bundle map went would count a second failure.
	writeCreds(t, creds, caA, spiffeid.RequireFromString("spiffe://a.test/other"), caA.Cert, caB.Cert)
	require.Eventually(t, func() bool { return testutil.ToFloat64(fail) == 3 }, 5*time.Second, 5*time.Millisecond)

	// Roots change alone: ALL is pushed without b.test.
	writeCreds(t, creds, caA, workload, caA.Cert)
	got = collect(t, s, func(m map[string]*tlsv3.Secret) bool {
		return len(trustDomainsOf(t, m[sds.AllName])) == 1
	}, names...)
	assert.Equal(t, []string{"a.test"}, trustDomainsOf(t, got[sds.AllName]))

	require.NoError(t, stop())
	_, err = os.Lstat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist, "the socket is removed on shutdown")
}

func TestRunSocketGroup(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "socket")
	ca := testca.New(t, tdA.Name())
	writeCreds(t, dir, ca, workload, ca.Cert)
	gid := os.Getgid()
	a := newTestAgent(t, Config{SocketPath: sock, CredentialsDir: dir, SocketGroup: strconv.Itoa(gid)})
	stop, done := runAgent(t, a)
	waitSocket(t, sock, done)
	fi, err := os.Stat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o660), fi.Mode().Perm())
	require.NoError(t, stop())
}

func TestNewRejectsUnknownGroup(t *testing.T) {
	_, err := New(Config{SocketGroup: "no-such-group-trustbridge"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no-such-group-trustbridge")
}

func TestRunPartialFiles(t *testing.T) {
	tests := []struct {
		name    string
		present []string
		missing []string
	}{
		{"only chain", []string{CertChainFile}, []string{KeyFile, RootCertFile}},
		{"no roots", []string{CertChainFile, KeyFile}, []string{RootCertFile}},
		{"only roots", []string{RootCertFile}, []string{CertChainFile, KeyFile}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := shortDir(t)
			creds := filepath.Join(dir, "creds")
			require.NoError(t, os.Mkdir(creds, 0o700))
			ca := testca.New(t, tdA.Name())
			writeCreds(t, creds, ca, workload, ca.Cert)
			for _, m := range tt.missing {
				require.NoError(t, os.Remove(filepath.Join(creds, m)))
			}
			// A CA is configured too: it must not be used instead.
			a := caAgent(t, filepath.Join(dir, "socket"), newFakeRotator(t, ca, workload), "127.0.0.1:1", nil)
			a.credsDir = creds
			err := a.Run(context.Background())
			require.Error(t, err)
			for _, m := range tt.missing {
				assert.Contains(t, err.Error(), m)
			}
			_, err = os.Lstat(filepath.Join(dir, "socket"))
			assert.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

func TestRunNoCredentialsNoCA(t *testing.T) {
	dir := shortDir(t)
	err := newTestAgent(t, Config{SocketPath: filepath.Join(dir, "socket"), CredentialsDir: dir}).Run(context.Background())
	require.Error(t, err)
	for _, flag := range []string{"--ca-addr", "--root-cert", "--token-file"} {
		assert.Contains(t, err.Error(), flag)
	}
}

func TestRunBadFilesAtStart(t *testing.T) {
	dir := shortDir(t)
	ca := testca.New(t, tdA.Name())
	other := testca.New(t, tdB.Name())
	writeCreds(t, dir, ca, workload, ca.Cert)
	// A merged root-cert.pem: a peer's root where a.test's belong.
	writeFile(t, filepath.Join(dir, RootCertFile), pemCerts(ca.Cert, other.Cert))
	err := newTestAgent(t, Config{SocketPath: filepath.Join(dir, "socket"), CredentialsDir: dir}).Run(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is a root of b.test, not of a.test")
}

func TestRunTwice(t *testing.T) {
	dir := shortDir(t)
	a := newTestAgent(t, Config{SocketPath: filepath.Join(dir, "socket"), CredentialsDir: dir})
	require.Error(t, a.Run(context.Background()))
	err := a.Run(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "twice")
	assert.False(t, errors.Is(err, ErrAlreadyServing))
}
