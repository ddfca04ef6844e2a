package kubecsr

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/trustbridge/trustbridge/ca/upstream"
)

func selfSigned(t testing.TB, isCA bool) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "t"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0), IsCA: isCA, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// newClient returns a Client on a fake clientset whose created CSR gets
// status from set (as a signer would) after creation.
func newClient(t *testing.T, timeout time.Duration, set func(*certv1.CertificateSigningRequest)) (*Client, *fake.Clientset) {
	t.Helper()
	cs := fake.NewClientset()
	cs.PrependReactor("create", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.CreateAction).GetObject().(*certv1.CertificateSigningRequest)
		if obj.Name == "" {
			obj.Name = obj.GenerateName + "abcde"
		}
		return false, nil, nil
	})
	root, _ := ParseCertificates(selfSigned(t, true))
	c, err := New(Config{Client: cs, SignerName: "example.com/trustbridge-intermediate", TrustDomain: "example.org", Roots: root, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	if set != nil {
		w, err := cs.CertificatesV1().CertificateSigningRequests().Watch(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for ev := range w.ResultChan() {
				obj := ev.Object.(*certv1.CertificateSigningRequest).DeepCopy()
				if len(obj.Status.Conditions) > 0 || len(obj.Status.Certificate) > 0 {
					continue
				}
				set(obj)
				_, _ = cs.CertificatesV1().CertificateSigningRequests().UpdateStatus(context.Background(), obj, metav1.UpdateOptions{})
			}
		}()
		t.Cleanup(w.Stop)
	}
	return c, cs
}

func TestSignIntermediate(t *testing.T) {
	caPEM := selfSigned(t, true)
	c, cs := newClient(t, time.Minute, func(o *certv1.CertificateSigningRequest) { o.Status.Certificate = caPEM })
	got, err := c.SignIntermediate(context.Background(), []byte("csr"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Chain) != 1 || len(got.Roots) != 1 {
		t.Fatalf("chain %d roots %d", len(got.Chain), len(got.Roots))
	}
	list, _ := cs.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if len(list.Items) != 0 {
		t.Fatalf("CSR objects left: %d", len(list.Items))
	}
	if c.String() != "kubernetes CSR signer example.com/trustbridge-intermediate" {
		t.Fatal(c.String())
	}
}

func TestSignIntermediateFailures(t *testing.T) {
	nonCA := selfSigned(t, false)
	for name, tc := range map[string]struct {
		set     func(*certv1.CertificateSigningRequest)
		want    string
		refused bool // asking again gets the same answer (upstream.IsRefused)
	}{
		"denied": {func(o *certv1.CertificateSigningRequest) {
			o.Status.Conditions = []certv1.CertificateSigningRequestCondition{{Type: certv1.CertificateDenied, Reason: "Policy", Message: "no"}}
		}, "denied: Policy: no", true},
		"failed": {func(o *certv1.CertificateSigningRequest) {
			o.Status.Conditions = []certv1.CertificateSigningRequestCondition{{Type: certv1.CertificateFailed, Reason: "Bad", Message: "x"}}
		}, "failed: Bad: x", true},
		"non-CA":  {func(o *certv1.CertificateSigningRequest) { o.Status.Certificate = nonCA }, "upstream returned a non-CA certificate", true},
		"garbage": {func(o *certv1.CertificateSigningRequest) { o.Status.Certificate = []byte("junk") }, "no PEM CERTIFICATE block", true},
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := newClient(t, time.Minute, tc.set)
			_, err := c.SignIntermediate(context.Background(), []byte("csr"), time.Hour)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			if got := upstream.IsRefused(err); got != tc.refused {
				t.Fatalf("refused %v, want %v: %v", got, tc.refused, err)
			}
		})
	}
}

// A CSR the API server refuses to create is a refusal when RBAC forbids
// it (someone must grant the rule), not when the server is unavailable.
func TestCreateRefusals(t *testing.T) {
	gr := certv1.Resource("certificatesigningrequests")
	for name, tc := range map[string]struct {
		err     error
		refused bool
	}{
		"forbidden":   {apierrors.NewForbidden(gr, "", errors.New("no rule")), true},
		"unavailable": {apierrors.NewServiceUnavailable("etcd is down"), false},
	} {
		t.Run(name, func(t *testing.T) {
			c, cs := newClient(t, time.Minute, nil)
			cs.PrependReactor("create", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.err
			})
			_, err := c.SignIntermediate(context.Background(), []byte("csr"), time.Hour)
			if err == nil || !strings.Contains(err.Error(), "create CertificateSigningRequest for signer example.com/trustbridge-intermediate") {
				t.Fatalf("err %v", err)
			}
			if got := upstream.IsRefused(err); got != tc.refused {
				t.Fatalf("refused %v, want %v: %v", got, tc.refused, err)
			}
		})
	}
}

func TestSignIntermediateTimeout(t *testing.T) {
	c, _ := newClient(t, time.Nanosecond, nil)
	_, err := c.SignIntermediate(context.Background(), []byte("csr"), time.Hour)
	if err == nil || !strings.Contains(err.Error(), "kubectl certificate approve trustbridge-intermediate-abcde") {
		t.Fatalf("err %v", err)
	}
}

func TestValidateSignerName(t *testing.T) {
	for _, bad := range []string{"", "example.com", "kubernetes.io/legacy-unknown", "Bad_Domain/x", "example.com/"} {
		if ValidateSignerName(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := ValidateSignerName("example.com/trustbridge-intermediate"); err != nil {
		t.Error(err)
	}
}

func FuzzParseCertificates(f *testing.F) {
	f.Add(selfSigned(f, true))
	f.Add(bytes.Repeat(selfSigned(f, false), 2))
	f.Add([]byte("-----BEGIN KEY-----\nAA==\n-----END KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := ParseCertificates(data)
		if err == nil && len(certs) == 0 {
			t.Fatal("no error and no certificates")
		}
	})
}
