// Package kubecsr is a ca.UpstreamAuthority that gets trustbridge's
// intermediate signed through the Kubernetes CSR API
// (certificates.k8s.io/v1 CertificateSigningRequest) by the signer named
// in Config.SignerName. Someone (an operator with kubectl, or an approver
// such as cert-manager's approver-policy) must approve the request; a
// signer for SignerName must then write a CA certificate into its status.
package kubecsr

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/upstream"
)

// DefaultTimeout is how long SignIntermediate waits for approval and
// signing when Config.Timeout is zero.
const DefaultTimeout = 5 * time.Minute

// minExpirationSeconds is the smallest expirationSeconds the API accepts.
const minExpirationSeconds = 600

// maxCertificateBytes bounds status.certificate.
const maxCertificateBytes = 1 << 20

// Config configures a Client.
type Config struct {
	Client      kubernetes.Interface
	SignerName  string // domain-prefixed path, not kubernetes.io/*
	TrustDomain string // for the CSR object's labels
	Roots       []*x509.Certificate
	Timeout     time.Duration
	Logger      *slog.Logger
}

// Client implements ca.UpstreamAuthority.
type Client struct {
	cfg Config
}

var _ ca.UpstreamAuthority = (*Client)(nil)

// New checks cfg.
func New(cfg Config) (*Client, error) {
	if cfg.Client == nil {
		return nil, errors.New("kube-csr upstream: no Kubernetes client")
	}
	if err := ValidateSignerName(cfg.SignerName); err != nil {
		return nil, err
	}
	if len(cfg.Roots) == 0 {
		return nil, fmt.Errorf("kube-csr upstream: no roots for signer %q: the CSR API does not return them; give the signer's CA bundle with --upstream-kube-roots", cfg.SignerName)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Client{cfg: cfg}, nil
}

// ValidateSignerName accepts a domain-prefixed path such as
// example.com/trustbridge-intermediate and refuses the kubernetes.io
// signers, which never issue CA certificates.
func ValidateSignerName(name string) error {
	domain, path, ok := strings.Cut(name, "/")
	if !ok || path == "" {
		return fmt.Errorf("signer name %q: want a domain-prefixed path such as example.com/trustbridge-intermediate", name)
	}
	if errs := validation.IsDNS1123Subdomain(domain); len(errs) > 0 {
		return fmt.Errorf("signer name %q: domain %q: %s", name, domain, strings.Join(errs, "; "))
	}
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
		return fmt.Errorf("signer name %q: the built-in kubernetes.io signers never issue CA certificates; name a signer that does (for example cert-manager's)", name)
	}
	return nil
}

// String names the upstream.
func (c *Client) String() string { return "kubernetes CSR signer " + c.cfg.SignerName }

// SignIntermediate creates a CSR object, waits for its certificate and
// deletes the object.
func (c *Client) SignIntermediate(ctx context.Context, csrDER []byte, ttl time.Duration) (*ca.UpstreamChain, error) {
	api := c.cfg.Client.CertificatesV1().CertificateSigningRequests()
	created, err := api.Create(ctx, c.csrObject(csrDER, ttl), metav1.CreateOptions{})
	if err != nil {
		err = fmt.Errorf("create CertificateSigningRequest for signer %s: %w", c.cfg.SignerName, err)
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			return nil, upstream.Refused(err) // RBAC or the object: until someone changes them
		}
		return nil, err
	}
	name := created.Name
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := api.Delete(dctx, name, metav1.DeleteOptions{}); err != nil {
			c.cfg.Logger.Warn("delete CertificateSigningRequest", "name", name, "error", err)
		}
	}()
	c.cfg.Logger.Info("waiting for CertificateSigningRequest", "name", name, "signer", c.cfg.SignerName)
	wctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	pemCerts, err := c.wait(wctx, created)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("CSR %s not signed within %s: approve it with `kubectl certificate approve %s` and check that a signer for %s runs", name, c.cfg.Timeout, name, c.cfg.SignerName)
		}
		return nil, err
	}
	chain, err := ParseCertificates(pemCerts)
	if err != nil {
		return nil, upstream.Refused(fmt.Errorf("CSR %s: %w", name, err))
	}
	if !chain[0].IsCA || !chain[0].BasicConstraintsValid {
		return nil, upstream.Refused(fmt.Errorf("CSR %s: upstream returned a non-CA certificate (signer %s): use a signer that issues CA certificates", name, c.cfg.SignerName))
	}
	return &ca.UpstreamChain{Chain: chain, Roots: c.cfg.Roots}, nil
}

func (c *Client) csrObject(csrDER []byte, ttl time.Duration) *certv1.CertificateSigningRequest {
	secs := int32(minExpirationSeconds)
	if s := ttl / time.Second; s > minExpirationSeconds && s < 1<<31 {
		secs = int32(s)
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": "trustbridge"}
	if errs := validation.IsValidLabelValue(c.cfg.TrustDomain); c.cfg.TrustDomain != "" && len(errs) == 0 {
		labels["trustbridge.io/trust-domain"] = c.cfg.TrustDomain
	}
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "trustbridge-intermediate-", Labels: labels},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}),
			SignerName:        c.cfg.SignerName,
			ExpirationSeconds: &secs,
			Usages:            []certv1.KeyUsage{certv1.UsageCertSign, certv1.UsageCRLSign, certv1.UsageDigitalSignature},
		},
	}
}

// wait watches the CSR object until it has a certificate, is denied or
// failed, or ctx ends.
func (c *Client) wait(ctx context.Context, obj *certv1.CertificateSigningRequest) ([]byte, error) {
	if done, cert, err := outcome(obj); done {
		return cert, err
	}
	w, err := c.cfg.Client.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", obj.Name).String(),
		ResourceVersion: obj.ResourceVersion,
	})
	if err != nil {
		return nil, fmt.Errorf("watch CertificateSigningRequest %s: %w", obj.Name, err)
	}
	defer w.Stop()
	// A change made before the watch started is not replayed by every
	// server (or fake): look once more now that the watch runs.
	cur, err := c.cfg.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, obj.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get CertificateSigningRequest %s: %w", obj.Name, err)
	}
	if done, cert, err := outcome(cur); done {
		return cert, err
	}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, fmt.Errorf("watch of CertificateSigningRequest %s ended before it was signed", obj.Name)
			}
			if ev.Type == watch.Deleted {
				return nil, fmt.Errorf("CertificateSigningRequest %s was deleted before it was signed", obj.Name)
			}
			got, ok := ev.Object.(*certv1.CertificateSigningRequest)
			if !ok {
				continue
			}
			if done, cert, err := outcome(got); done {
				return cert, err
			}
		}
	}
}

func outcome(obj *certv1.CertificateSigningRequest) (bool, []byte, error) {
	for _, cond := range obj.Status.Conditions {
		switch cond.Type {
		case certv1.CertificateDenied:
			return true, nil, upstream.Refused(fmt.Errorf("CSR %s denied: %s: %s", obj.Name, cond.Reason, cond.Message))
		case certv1.CertificateFailed:
			return true, nil, upstream.Refused(fmt.Errorf("CSR %s failed: %s: %s", obj.Name, cond.Reason, cond.Message))
		}
	}
	if len(obj.Status.Certificate) > 0 {
		return true, obj.Status.Certificate, nil
	}
	return false, nil, nil
}

// ParseCertificates parses status.certificate: PEM CERTIFICATE blocks,
// the first the signed certificate, the rest its chain.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	if len(data) > maxCertificateBytes {
		return nil, fmt.Errorf("status.certificate is %d bytes, more than %d", len(data), maxCertificateBytes)
	}
	var certs []*x509.Certificate
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("status.certificate has a %q PEM block, want CERTIFICATE", b.Type)
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("status.certificate block %d: %w", len(certs)+1, err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, errors.New("status.certificate has no PEM CERTIFICATE block")
	}
	return certs, nil
}
