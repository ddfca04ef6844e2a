package kubetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// CSRSigner is a kube-controller-manager running only its CSR signing
// controller (--controllers=csrsigning) against the API server: the
// built-in kubernetes.io/* signers of a real cluster, signing approved
// CertificateSigningRequests with SigningCA.
type CSRSigner struct {
	// SigningCA is the cluster signing CA, minted for this test: the
	// issuer of every certificate the built-in signers write.
	SigningCA *x509.Certificate
	// Exited is closed when the process has exited; a test waiting for a
	// signature selects on it so that a crashed controller manager fails
	// the test instead of leaving it waiting.
	Exited <-chan struct{}
	// Log is the file its standard output and error go to.
	Log string
}

// CSRSigner starts kube-controller-manager (from AssetsDir, built by
// `make kube-tools`) with only the CSR signing controller, signing with a
// CA minted now, its key 0600 in the test's temporary directory. It is
// stopped when the test ends, before the shared API server. It skips the
// test when the binary is missing, or fails it under RequireEnv=require.
//
// Every kube-controller-manager started on the API server signs every
// approved CSR of the built-in signers: tests that use one must not run
// in parallel with each other.
func (e *Env) CSRSigner(t testing.TB) *CSRSigner {
	t.Helper()
	bin := filepath.Join(AssetsDir(), "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv(RequireEnv) == "require" {
			t.Fatalf("kube-controller-manager required (%s=require) but missing: %v (run make kube-tools)", RequireEnv, err)
		}
		t.Skipf("no kube-controller-manager (run make kube-tools): %v", err)
	}
	dir := t.TempDir()
	caCert, certFile, keyFile := writeSigningCA(t, dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := e.writeKubeconfig(kubeconfig); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	logFile := filepath.Join(dir, "kube-controller-manager.log")
	cancel, exited, err := startCSRSigning(bin, logFile,
		"--kubeconfig="+kubeconfig,
		"--controllers=csrsigning",
		"--cluster-signing-cert-file="+certFile,
		"--cluster-signing-key-file="+keyFile,
		"--leader-elect=false",
		// No serving endpoint: nothing but the API server is talked to.
		"--secure-port=0",
		"--cert-dir="+filepath.Join(dir, "serving"),
		"--use-service-account-credentials=false",
	)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	// Cleanups run before Main stops the API server.
	t.Cleanup(func() {
		cancel()
		<-exited
		if t.Failed() {
			if b, err := os.ReadFile(logFile); err == nil {
				t.Logf("kube-controller-manager log:\n%s", b)
			}
		}
	})
	return &CSRSigner{SigningCA: caCert, Exited: exited, Log: logFile}
}

// startCSRSigning starts bin with args, its output to logFile. cancel
// stops it as a controller manager is stopped: SIGTERM, then killed if it
// lingers; exited is closed once it has exited.
func startCSRSigning(bin, logFile string, args ...string) (context.CancelFunc, <-chan struct{}, error) {
	log, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		_ = log.Close()
		return nil, nil, fmt.Errorf("start kube-controller-manager: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = log.Close()
		close(exited)
	}()
	return cancel, exited, nil
}

// writeSigningCA mints a self-signed ECDSA P-256 CA, an ordinary cluster
// CA certificate, and writes it and its key (0600) to dir as PEM.
func writeSigningCA(t testing.TB, dir string) (*x509.Certificate, string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("kubetest: signing CA key: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "kubetest cluster signing CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatalf("kubetest: signing CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("kubetest: signing CA: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("kubetest: signing CA key: %v", err)
	}
	certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	return cert, certFile, keyFile
}

// writeKubeconfig writes a kubeconfig naming this API server with its
// cluster admin credential to path (0600: it holds a private key).
func (e *Env) writeKubeconfig(path string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: e.Config.Host, CertificateAuthorityData: e.Config.CAData}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: e.Config.CertData, ClientKeyData: e.Config.KeyData, Token: e.Config.BearerToken}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}
