package authn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1informers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/lru"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// serviceAccountIdentity is the Identity TokenReview proved for id, a
// spiffe://<td>/ns/<namespace>/sa/<name> it built itself, with the service
// account's UID from the review (status.user.uid) as the grant.
func serviceAccountIdentity(id spiffeid.ID, uid string) Identity {
	ident := Identity{ID: id, Method: MethodKubernetesJWT}
	if ns, sa, ok := ServiceAccountOf(id); ok {
		ident.Grant = &Grant{Method: MethodKubernetesJWT, Ref: ns + "/" + sa, UID: uid}
	}
	return ident
}

// ServiceAccountOf splits an ID of the form /ns/<namespace>/sa/<name>, the
// identity of a Kubernetes service account.
func ServiceAccountOf(id spiffeid.ID) (ns, sa string, ok bool) {
	parts := strings.Split(id.Path(), "/")
	if len(parts) != 5 || parts[0] != "" || parts[1] != "ns" || parts[3] != "sa" || parts[2] == "" || parts[4] == "" {
		return "", "", false
	}
	return parts[2], parts[4], true
}

// Confirmation limits of ServiceAccountGrants.
const (
	// DefaultServiceAccountConfirmRate bounds the API calls that confirm a
	// refusal, per second, with bursts of twice as many: enough for the
	// rare fresh or re-created account, while a client that keeps renewing
	// with a revoked certificate cannot turn its calls into API load.
	DefaultServiceAccountConfirmRate = 5
	serviceAccountConfirmTimeout     = 5 * time.Second
)

// ServiceAccountGrantsConfig configures NewServiceAccountGrants.
type ServiceAccountGrantsConfig struct {
	// Client lists and watches ServiceAccounts in every namespace (RBAC:
	// get, list, watch serviceaccounts). Required.
	Client kubernetes.Interface
	// ConfirmRate bounds the API calls per second that confirm a refusal
	// (see ServiceAccountGrants); default DefaultServiceAccountConfirmRate.
	ConfirmRate rate.Limit
	// OnDelete, when set, is called after the informer sees a service
	// account deleted, once the deletion decides CheckGrant; tests wait on
	// it.
	OnDelete func(namespace, name string)
	// Logger; nil discards.
	Logger *slog.Logger
}

// ServiceAccountGrants decides whether a Kubernetes grant still stands:
// the service account it names exists, is not being deleted, and has the
// UID recorded in the grant (a re-created account of the same name is a
// different grant). It answers from an informer's cache, so a renewal
// costs no API call and a deleted account stops renewals within the watch
// latency.
//
// Until the informer has listed every service account once, CheckGrant
// answers ErrUnavailable: the certificate service refuses the renewal as
// retryable, and the caller's certificate is still valid while it retries.
// After that, if the API server becomes unreachable, the last known state
// decides until the watch resumes: renewals keep working through an API
// server outage, and a deletion made during the outage takes effect when
// the watch catches up. A bound on renewal chains
// (--max-renewal-lifetime) limits what that staleness can cost.
//
// A refusal is confirmed with a GET before it is returned, because the
// informer may not have seen an account created (or re-created) a moment
// ago; a stale "not found" must not revoke a healthy chain. Confirmations
// are rate-limited (ConfirmRate); beyond the limit the refusal is
// retryable (ErrUnavailable), never final. A refusal the API server
// confirmed for a grant with a UID is remembered: UIDs are never reused,
// so that grant is gone for good and its holder, however often it calls,
// never spends the confirmation budget again.
type ServiceAccountGrants struct {
	client   kubernetes.Interface
	informer cache.SharedIndexInformer
	lister   corev1listers.ServiceAccountLister
	confirm  *rate.Limiter
	revoked  *lru.Cache // revokedGrant → error: refusals the API server confirmed
	logger   *slog.Logger
}

// revokedGrant names a service account incarnation the API server said is
// gone: deleted, or re-created under another UID.
type revokedGrant struct{ ref, uid string }

// maxRevokedGrants bounds the confirmed refusals remembered.
const maxRevokedGrants = 4096

// NewServiceAccountGrants builds the informer; Run starts it.
func NewServiceAccountGrants(cfg ServiceAccountGrantsConfig) (*ServiceAccountGrants, error) {
	if cfg.Client == nil {
		return nil, errors.New("authn: service account grants: a Kubernetes client is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if !(cfg.ConfirmRate >= 0) {
		return nil, fmt.Errorf("authn: service account grants: confirm rate %v is negative", cfg.ConfirmRate)
	}
	if cfg.ConfirmRate == 0 {
		cfg.ConfirmRate = DefaultServiceAccountConfirmRate
	}
	inf := corev1informers.NewServiceAccountInformer(cfg.Client, metav1.NamespaceAll, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	// Only names, UIDs and deletion marks are needed; a cluster's service
	// accounts cost a few hundred bytes each this way.
	if err := inf.SetTransform(trimServiceAccount); err != nil {
		return nil, fmt.Errorf("authn: service account grants: %w", err)
	}
	s := &ServiceAccountGrants{
		client: cfg.Client, informer: inf, lister: corev1listers.NewServiceAccountLister(inf.GetIndexer()),
		confirm: rate.NewLimiter(cfg.ConfirmRate, 2*int(math.Ceil(float64(cfg.ConfirmRate)))), logger: cfg.Logger,
		revoked: lru.New(maxRevokedGrants),
	}
	// Before the first list succeeds every Kubernetes-granted renewal is
	// refused as unavailable; say why, in our log, as long as that lasts.
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		if !inf.HasSynced() {
			s.logger.Warn("cannot list service accounts: renewals of certificates a service account granted are refused as unavailable until it works (RBAC: get, list, watch serviceaccounts)",
				logattr.Error, err)
		}
	}); err != nil {
		return nil, fmt.Errorf("authn: service account grants: %w", err)
	}
	// The indexer is updated before handlers run, so when OnDelete is
	// called CheckGrant already sees the deletion.
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		s.deleted(obj, cfg.OnDelete)
	}}); err != nil {
		return nil, fmt.Errorf("authn: service account grants: %w", err)
	}
	return s, nil
}

// deleted records a deletion: renewals of every chain the account granted
// stop from now on, which an operator wants to see in the log.
func (s *ServiceAccountGrants) deleted(obj any, hook func(string, string)) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	sa, ok := obj.(*corev1.ServiceAccount)
	if !ok {
		return
	}
	s.logger.Info("service account deleted; renewals of the certificates it granted are refused from now on",
		"service_account", sa.Namespace+"/"+sa.Name, "uid", string(sa.UID))
	if hook != nil {
		hook(sa.Namespace, sa.Name)
	}
}

// trimServiceAccount keeps what CheckGrant reads.
func trimServiceAccount(obj any) (any, error) {
	sa, ok := obj.(*corev1.ServiceAccount)
	if !ok {
		return obj, nil // a tombstone: the informer handles it
	}
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
		Name: sa.Name, Namespace: sa.Namespace, UID: sa.UID,
		ResourceVersion: sa.ResourceVersion, DeletionTimestamp: sa.DeletionTimestamp,
	}}, nil
}

// Run watches service accounts until ctx is done; it returns nil then.
func (s *ServiceAccountGrants) Run(ctx context.Context) error {
	s.informer.RunWithContext(ctx)
	return nil
}

// HasSynced reports whether every service account has been listed once.
func (s *ServiceAccountGrants) HasSynced() bool { return s.informer.HasSynced() }

// CheckGrant implements the check described on ServiceAccountGrants.
func (s *ServiceAccountGrants) CheckGrant(ctx context.Context, id spiffeid.ID, g Grant) error {
	if g.Method != MethodKubernetesJWT {
		return fmt.Errorf("authn: %s: grant of method %q is not a service account grant: %w", MethodKubernetesJWT, g.Method, ErrGrantRevoked)
	}
	ns, name, err := SplitServiceAccountRef(g.Ref)
	if err != nil {
		return fmt.Errorf("authn: %s: %w: %w", MethodKubernetesJWT, err, ErrGrantRevoked)
	}
	if idNS, idSA, ok := ServiceAccountOf(id); !ok || idNS != ns || idSA != name {
		return fmt.Errorf("authn: %s: grant names service account %s, not the one of %s: %w", MethodKubernetesJWT, g.Ref, id, ErrGrantRevoked)
	}
	if !s.informer.HasSynced() {
		return fmt.Errorf("authn: %s: service accounts not listed yet: %w", MethodKubernetesJWT, ErrUnavailable)
	}
	key := revokedGrant{ref: g.Ref, uid: g.UID}
	if v, gone := s.revoked.Get(key); gone && g.UID != "" {
		return v.(error) // the verdict the API server confirmed
	}
	sa, err := s.lister.ServiceAccounts(ns).Get(name)
	if judge(sa, err, g) != nil {
		// The cache says no; only the API server may make that final. When
		// the confirmation budget is spent (callers with revoked grants
		// can spend it at will), the answer stays a refusal but a
		// retryable one, so a service account created moments ago is
		// never refused for good because of them.
		if !s.confirm.Allow() {
			return fmt.Errorf("authn: %s: service account %s not confirmed (confirmation budget spent; retry): %w", MethodKubernetesJWT, g.Ref, ErrUnavailable)
		}
		sa, err = s.get(ctx, ns, name)
		if v := s.verdict(id, g, sa, err); errors.Is(v, ErrGrantRevoked) && g.UID != "" {
			s.revoked.Add(key, v)
			return v
		}
	}
	return s.verdict(id, g, sa, err)
}

// judge is whether sa (or the error looking it up) still grants g.
func judge(sa *corev1.ServiceAccount, err error, g Grant) error {
	switch {
	case err != nil:
		return err
	case sa.DeletionTimestamp != nil:
		return errors.New("being deleted")
	case g.UID != "" && string(sa.UID) != g.UID:
		return errors.New("uid differs")
	}
	return nil
}

// get asks the API server itself.
func (s *ServiceAccountGrants) get(ctx context.Context, ns, name string) (*corev1.ServiceAccount, error) {
	ctx, cancel := context.WithTimeout(ctx, serviceAccountConfirmTimeout)
	defer cancel()
	sa, err := s.client.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		s.logger.Warn("could not confirm a service account with the API server", "service_account", ns+"/"+name, logattr.Error, err)
	}
	return sa, err
}

// verdict turns the lookup into CheckGrant's answer.
func (s *ServiceAccountGrants) verdict(id spiffeid.ID, g Grant, sa *corev1.ServiceAccount, err error) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("authn: %s: service account %s that granted %s was deleted: %w", MethodKubernetesJWT, g.Ref, id, ErrGrantRevoked)
	case err != nil:
		return fmt.Errorf("authn: %s: service account %s: %w: %w", MethodKubernetesJWT, g.Ref, err, ErrUnavailable)
	case sa.DeletionTimestamp != nil:
		return fmt.Errorf("authn: %s: service account %s that granted %s is being deleted: %w", MethodKubernetesJWT, g.Ref, id, ErrGrantRevoked)
	case g.UID != "" && string(sa.UID) != g.UID:
		return fmt.Errorf("authn: %s: service account %s that granted %s was deleted and re-created (uid %s, granted by %s): %w",
			MethodKubernetesJWT, g.Ref, id, sa.UID, g.UID, ErrGrantRevoked)
	}
	return nil
}
