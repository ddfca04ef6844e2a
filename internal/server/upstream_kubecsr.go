package server

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"

	"github.com/trustbridge/trustbridge/ca/upstream/kubecsr"
)

// kubeCSROptions are the flags of --upstream kube-csr.
type kubeCSROptions struct {
	signerName string
	timeout    time.Duration
	rootsFile  string
}

func addKubeCSRFlags(f *pflag.FlagSet, o *kubeCSROptions) {
	f.StringVar(&o.signerName, "upstream-signer-name", "", "with --upstream kube-csr: signerName of the CertificateSigningRequest (example.com/trustbridge-intermediate); kubernetes.io/* signers are refused, they never issue CA certificates")
	f.DurationVar(&o.timeout, "upstream-csr-timeout", kubecsr.DefaultTimeout, "with --upstream kube-csr: how long to wait for the CSR to be approved and signed")
	f.StringVar(&o.rootsFile, "upstream-kube-roots", "", "with --upstream kube-csr: PEM file of the signer's root certificates (the CSR API does not return them)")
}

// newKubeCSRClient builds the kube-csr upstream from its flags and the
// --kubeconfig (or in-cluster) Kubernetes configuration.
func newKubeCSRClient(o kubeCSROptions, kubeconfig, trustDomain string, logger *slog.Logger) (*kubecsr.Client, error) {
	cfg, ok, err := LoadKubeConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("--upstream kube-csr needs a Kubernetes API: give --kubeconfig or run in a pod")
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	roots, err := readRootsFile(o.rootsFile)
	if err != nil {
		return nil, err
	}
	return kubecsr.New(kubecsr.Config{Client: client, SignerName: o.signerName, TrustDomain: trustDomain,
		Roots: roots, Timeout: o.timeout, Logger: logger})
}

func readRootsFile(path string) ([]*x509.Certificate, error) {
	if path == "" {
		return nil, errors.New("--upstream kube-csr needs --upstream-kube-roots FILE: the signer's CA bundle (PEM)")
	}
	roots, err := readPEMCerts(path)
	if err != nil {
		return nil, fmt.Errorf("--upstream-kube-roots: %w", err)
	}
	return roots, nil
}
