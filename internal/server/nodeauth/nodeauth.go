package nodeauth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultTrustedNodeAccount is the service account of Istio's ztunnel,
// the node proxy that impersonates the pods of its node.
const DefaultTrustedNodeAccount = "istio-system/ztunnel"

// ErrNotAuthorized means the caller may not have a certificate for the
// identity it asked for; it is always wrapped with the reason.
var ErrNotAuthorized = errors.New("impersonation not authorized")

// resyncPeriod is the informer's resync: the watch keeps the cache
// current; a resync only re-delivers what it holds.
const resyncPeriod = 10 * time.Minute

// indexNodeAccount indexes pods by "<node>/<namespace>/<service account>",
// indexNode by node.
const (
	indexNodeAccount = "nodeAccount"
	indexNode        = "node"
)

// MapSource is the identity map in force (an identitymap.Cell); Load
// returns nil until one is published.
type MapSource interface {
	Load() *identitymap.Map
}

// Config configures New.
type Config struct {
	// Client reads pods. Required.
	Client kubernetes.Interface
	// TrustDomain is the trust domain of impersonated identities. Required.
	TrustDomain spiffeid.TrustDomain
	// TrustedNodeAccounts are the service accounts ("namespace/name") of
	// the node proxies allowed to impersonate; default
	// DefaultTrustedNodeAccount.
	TrustedNodeAccounts []string
	// IdentityMap, when set, decides which identities a pod has (see the
	// package documentation); nil grants the Istio form only.
	IdentityMap MapSource
	// MapReady, with IdentityMap, reports whether the map holds every
	// source's rules (the ClusterIdentityMapping resources were read);
	// until then requests are refused as unavailable. Nil: always.
	MapReady func() bool
	// Logger; nil discards.
	Logger *slog.Logger
}

// Authorizer makes the checks described in the package documentation.
type Authorizer struct {
	td       spiffeid.TrustDomain
	trusted  map[string]bool // "namespace/name"
	informer cache.SharedIndexInformer
	idmap    MapSource // nil: the Istio form only
	mapReady func() bool
	logger   *slog.Logger
}

// New checks cfg and builds the pod informer; Run starts it.
func New(cfg Config) (*Authorizer, error) {
	if cfg.Client == nil || cfg.TrustDomain.IsZero() {
		return nil, errors.New("nodeauth: a Kubernetes client and a trust domain are required")
	}
	accounts := cfg.TrustedNodeAccounts
	if len(accounts) == 0 {
		accounts = []string{DefaultTrustedNodeAccount}
	}
	a := &Authorizer{td: cfg.TrustDomain, trusted: map[string]bool{}, idmap: cfg.IdentityMap, mapReady: cfg.MapReady, logger: cfg.Logger}
	for _, acct := range accounts {
		if err := CheckAccount(acct); err != nil {
			return nil, fmt.Errorf("nodeauth: trusted node account %q: %w", acct, err)
		}
		a.trusted[acct] = true
	}
	if a.logger == nil {
		a.logger = slog.New(slog.DiscardHandler)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, resyncPeriod, informers.WithTransform(trimPod))
	a.informer = factory.Core().V1().Pods().Informer()
	if err := a.informer.AddIndexers(cache.Indexers{indexNodeAccount: nodeAccountIndex, indexNode: nodeIndex}); err != nil {
		return nil, fmt.Errorf("nodeauth: %w", err)
	}
	// Until the first list succeeds every impersonation is refused as
	// unavailable; say why in our log as long as that lasts.
	if err := a.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		if !a.informer.HasSynced() {
			a.logger.Warn("cannot list pods: node proxies' requests for the certificates of pods on their node are refused as unavailable until it works (RBAC: get, list, watch pods)",
				logattr.Error, err)
		}
	}); err != nil {
		return nil, fmt.Errorf("nodeauth: %w", err)
	}
	return a, nil
}

// CheckAccount checks a "namespace/name" service account reference.
func CheckAccount(acct string) error {
	ns, name, ok := strings.Cut(acct, "/")
	if !ok || strings.Contains(name, "/") {
		return errors.New(`want "namespace/serviceaccount"`)
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return fmt.Errorf("namespace: %s", strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("service account: %s", strings.Join(errs, "; "))
	}
	return nil
}

// trimPod keeps what the checks read, so a cluster's pods cost little
// memory: the labels are the identity map's podLabels and
// {{.PodLabels.<key>}}.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp,
			Labels: p.Labels},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, ServiceAccountName: p.Spec.ServiceAccountName},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}, nil
}

func nodeAccountIndex(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{p.Spec.NodeName + "/" + p.Namespace + "/" + serviceAccountOf(p)}, nil
}

func nodeIndex(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{p.Spec.NodeName}, nil
}

// serviceAccountOf is the pod's service account ("default" when unset, as
// the API server defaults it).
func serviceAccountOf(p *corev1.Pod) string {
	if p.Spec.ServiceAccountName == "" {
		return "default"
	}
	return p.Spec.ServiceAccountName
}

// Run runs the pod informer until ctx is done.
func (a *Authorizer) Run(ctx context.Context) error {
	a.informer.RunWithContext(ctx)
	return nil
}

// HasSynced reports whether the pods have been listed once.
func (a *Authorizer) HasSynced() bool { return a.informer.HasSynced() }

// AuthorizeImpersonation returns nil when caller may have a certificate for
// target. Refusals wrap ErrNotAuthorized with the reason, or
// authn.ErrUnavailable when the answer is not known yet.
func (a *Authorizer) AuthorizeImpersonation(_ context.Context, caller authn.Identity, target spiffeid.ID) error {
	node, err := a.callerNode(caller)
	if err != nil {
		return err
	}
	if a.idmap != nil {
		return a.mapped(caller, node, grant{id: target})
	}
	ns, sa, err := a.workload(target)
	if err != nil {
		return err
	}
	pods, err := a.informer.GetIndexer().ByIndex(indexNodeAccount, node+"/"+ns+"/"+sa)
	if err != nil {
		return fmt.Errorf("nodeauth: %w", err)
	}
	if !slices.ContainsFunc(pods, running) {
		return fmt.Errorf("nodeauth: %w: no running pod of service account %s/%s is on node %s, where %s runs",
			ErrNotAuthorized, ns, sa, node, caller.ID)
	}
	return nil
}

// AuthorizeImpersonationNames returns nil when caller may have a
// certificate for target carrying exactly dnsNames (sorted, each once):
// some running pod on the caller's node must get from the identity map
// both target and exactly those names, the names of one pod, never a mix
// of several pods' names. Without an identity map no names are granted:
// the Istio form gives a workload none (the server's
// --workload-dns-name-template adds its own). Refusals are those of
// AuthorizeImpersonation.
func (a *Authorizer) AuthorizeImpersonationNames(_ context.Context, caller authn.Identity, target spiffeid.ID, dnsNames []string) error {
	node, err := a.callerNode(caller)
	if err != nil {
		return err
	}
	if a.idmap == nil {
		return fmt.Errorf("nodeauth: %w: DNS names %q for %s: this server has no identity map (--identity-map), and without one a workload gets no DNS names "+
			"from its node agent; give the server the agent's identity map, or drop the rule's dnsNames", ErrNotAuthorized, dnsNames, target)
	}
	return a.mapped(caller, node, grant{id: target, dnsNames: dnsNames, withNames: true})
}

// callerNode checks the caller is a trusted node proxy authenticated by a
// token bound to its pod, and returns that pod's node.
func (a *Authorizer) callerNode(caller authn.Identity) (string, error) {
	ns, sa, ok := accountOf(a.td, caller.ID)
	switch {
	case caller.Method != authn.MethodKubernetesJWT || !ok:
		return "", fmt.Errorf("nodeauth: %w: %s is not a node proxy: only a service account token of a trusted node account may impersonate", ErrNotAuthorized, caller.ID)
	case !a.trusted[ns+"/"+sa]:
		return "", fmt.Errorf("nodeauth: %w: service account %s/%s is not a trusted node account (--ca-trusted-node-accounts)", ErrNotAuthorized, ns, sa)
	case caller.Pod.IsZero():
		return "", fmt.Errorf("nodeauth: %w: the token of %s/%s is not bound to a pod, so its node is unknown", ErrNotAuthorized, ns, sa)
	case !a.informer.HasSynced():
		return "", fmt.Errorf("nodeauth: pods not listed yet: %w", authn.ErrUnavailable)
	}
	obj, found, err := a.informer.GetIndexer().GetByKey(caller.Pod.Namespace + "/" + caller.Pod.Name)
	if err != nil {
		return "", fmt.Errorf("nodeauth: %w", err)
	}
	if !found {
		// A pod created moments ago may not have reached the cache yet.
		return "", fmt.Errorf("nodeauth: pod %s/%s of the caller not seen yet: %w", caller.Pod.Namespace, caller.Pod.Name, authn.ErrUnavailable)
	}
	p := obj.(*corev1.Pod)
	switch {
	case string(p.UID) != caller.Pod.UID:
		return "", fmt.Errorf("nodeauth: %w: pod %s/%s is not the one the token was bound to (uid differs)", ErrNotAuthorized, p.Namespace, p.Name)
	case serviceAccountOf(p) != sa:
		return "", fmt.Errorf("nodeauth: %w: pod %s/%s runs as %s, not %s", ErrNotAuthorized, p.Namespace, p.Name, serviceAccountOf(p), sa)
	case p.Spec.NodeName == "" || !running(p):
		return "", fmt.Errorf("nodeauth: %w: pod %s/%s of the caller is not running on a node", ErrNotAuthorized, p.Namespace, p.Name)
	}
	return p.Spec.NodeName, nil
}

// workload checks target is a service account identity of this trust
// domain.
func (a *Authorizer) workload(target spiffeid.ID) (ns, sa string, err error) {
	ns, sa, ok := accountOf(a.td, target)
	if !ok {
		return "", "", fmt.Errorf("nodeauth: %w: %s is not spiffe://%s/ns/<namespace>/sa/<service account>", ErrNotAuthorized, target, a.td.Name())
	}
	return ns, sa, nil
}

// accountOf splits spiffe://<td>/ns/<ns>/sa/<sa> of trust domain td.
func accountOf(td spiffeid.TrustDomain, id spiffeid.ID) (ns, sa string, ok bool) {
	if id.TrustDomain() != td {
		return "", "", false
	}
	return authn.ServiceAccountOf(id)
}

// running reports whether a pod is on its node and not finished or going.
func running(obj any) bool {
	p, ok := obj.(*corev1.Pod)
	return ok && p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}
