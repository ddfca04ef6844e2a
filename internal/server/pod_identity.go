package server

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/trustbridge/trustbridge/ca/podcert"
	"github.com/trustbridge/trustbridge/federation/distribution"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// Audit events of --pod-certificate-signer, one per request's outcome.
const (
	eventPodCertIssued = "pod_certificate_issued"
	eventPodCertDenied = "pod_certificate_denied"
	eventPodCertFailed = "pod_certificate_failed"
)

// checkPodCertFlags refuses --pod-certificate-signer without what it
// needs, before anything starts.
func checkPodCertFlags(o KubeConfig, maxWorkloadTTL time.Duration) error {
	if o.PodCertSigner == "" {
		if o.PodCertNamespaces != "" {
			return errors.New("--pod-certificate-namespaces needs --pod-certificate-signer")
		}
		return nil
	}
	if o.Storage != StorageKube {
		return errors.New("--pod-certificate-signer needs --storage kube: the leader signs the PodCertificateRequests the API server holds")
	}
	if err := distribution.CheckSignerName(o.PodCertSigner); err != nil {
		return fmt.Errorf("--pod-certificate-signer: %w", err)
	}
	if strings.HasPrefix(o.PodCertSigner, "kubernetes.io/") {
		return fmt.Errorf("--pod-certificate-signer %q: signer names under kubernetes.io/ are Kubernetes' own; use a domain of yours, e.g. trustbridge.io/svid", o.PodCertSigner)
	}
	if _, err := podCertNamespaces(o.PodCertNamespaces); err != nil {
		return err
	}
	if maxWorkloadTTL > 0 && maxWorkloadTTL < time.Hour {
		return fmt.Errorf("--pod-certificate-signer needs --max-workload-ttl of at least 1h (a pod certificate lives at least an hour), not %s", maxWorkloadTTL)
	}
	return nil
}

// podCertNamespaces parses --pod-certificate-namespaces, which is
// required: no namespace gets pod certificates unless named.
func podCertNamespaces(s string) (labels.Selector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("--pod-certificate-signer needs --pod-certificate-namespaces SELECTOR: the namespaces whose pods may get certificates, " +
			"e.g. 'trustbridge.io/pod-certificates=enabled', or 'kubernetes.io/metadata.name in (shop,pay)'; every namespace: 'kubernetes.io/metadata.name'")
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("--pod-certificate-namespaces %q: %w", s, err)
	}
	return sel, nil
}

// podCertSigner is --pod-certificate-signer, run by the leader: nil
// without it. It signs through the CA, counts what it signs in the
// issuance ledger (in use until it expires: the kubelet renews with a
// new request) and audits every outcome.
func (p *serverParts) podCertSigner(reg prometheus.Registerer, logger *slog.Logger) (*podcert.Signer, error) {
	o := p.kube.o
	if o.PodCertSigner == "" {
		return nil, nil
	}
	sel, err := podCertNamespaces(o.PodCertNamespaces)
	if err != nil {
		return nil, err
	}
	cfg := podcert.Config{
		Client: p.kube.client, SignerName: o.PodCertSigner, TrustDomain: p.td,
		Authority: p.authority, Namespaces: sel,
		Outcome: p.podCertOutcome,
		Logger:  logger.With(logattr.Component, "pod-certificates"), Registerer: reg,
	}
	if p.idmap != nil {
		cfg.Identify = p.podIdentityFromMap
	} else if p.gs != nil && p.gs.dnsNames != nil {
		tmpl := p.gs.dnsNames
		cfg.DNSNames = func(id spiffeid.ID) []string {
			// The pod's service account was read from the API server:
			// the grant TokenReview would have given it.
			ns, sa, _ := authn.ServiceAccountOf(id)
			names, err := tmpl.Names(id, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: ns + "/" + sa})
			if err != nil {
				logger.Debug("pod certificate without a workload DNS name", logattr.SPIFFEID, id.String(), logattr.Error, err)
			}
			return names
		}
	}
	return podcert.New(cfg)
}

func (p *serverParts) podCertOutcome(out podcert.Outcome) {
	var e audit.Entry
	switch out.Result {
	case "issued":
		if p.ledger != nil {
			p.ledger.recordMinted(out.Leaf)
		}
		e = audit.Entry{Event: eventPodCertIssued, Reason: fmt.Sprintf("X509-SVID %s (serial %s, expires %s) for pod %s/%s (PodCertificateRequest %s)",
			out.SPIFFEID, out.Leaf.SerialNumber.Text(16), out.Leaf.NotAfter.UTC().Format("2006-01-02T15:04:05Z"), out.Namespace, out.Pod, out.Request)}
	case "denied":
		e = audit.Entry{Event: eventPodCertDenied, Reason: fmt.Sprintf("pod %s/%s (PodCertificateRequest %s): %s: %s", out.Namespace, out.Pod, out.Request, out.Reason, out.Message)}
	default: // failed, or undecided (the API server refused the status)
		e = audit.Entry{Event: eventPodCertFailed, Reason: fmt.Sprintf("pod %s/%s (PodCertificateRequest %s): %s: %s", out.Namespace, out.Pod, out.Request, out.Reason, out.Message)}
	}
	e.TrustDomain = p.td.Name()
	p.trail.record(e)
}

// podIdentityFromMap gives a pod the identity the identity map gives it as
// the server knows it (its namespace, service account, name, UID, node
// and labels, read from the API server), as for a node proxy's pod: the
// same rules node agents are held to.
func (p *serverParts) podIdentityFromMap(pod *corev1.Pod) (spiffeid.ID, []string, error) {
	if ready := p.idmap.ready(); ready != nil && !ready() {
		return spiffeid.ID{}, nil, errors.New("the identity map's ClusterIdentityMapping resources are not read yet")
	}
	m := p.idmap.cell.Load()
	if m == nil {
		return spiffeid.ID{}, nil, errors.New("no identity map loaded yet")
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	ident, err := m.Identify(identitymap.ServerFacts(pod.Namespace, sa, pod.Name, string(pod.UID), pod.Spec.NodeName, pod.Labels))
	switch {
	case errors.Is(err, identitymap.ErrNoIdentity), errors.Is(err, identitymap.ErrConflict), errors.Is(err, identitymap.ErrFacts):
		return spiffeid.ID{}, nil, fmt.Errorf("%w: %w", podcert.ErrNoIdentity, err)
	case err != nil:
		return spiffeid.ID{}, nil, err
	}
	return ident.ID, ident.DNSNames, nil
}
