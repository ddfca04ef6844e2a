package policycrd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1informers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// ServiceAccountLabels is a trustpolicy.LabelSource: the labels of every
// service account in the cluster, from an informer, for rules that select
// workloads by label.
//
// RBAC: list and watch serviceaccounts in every namespace (the ClusterRole
// in deploy/rbac grants get, list, watch). Only names and labels are kept,
// so memory grows with the cluster's service accounts and their labels,
// nothing else.
//
// Labels answers nil (unknown) for an account the informer has not seen
// yet, so label selectors match nothing: a rule that grants by label
// grants nothing before the labels are known, and Changed closes once
// they are (the informer's store is updated before its handlers run).
type ServiceAccountLabels struct {
	informer cache.SharedIndexInformer
	lister   corev1listers.ServiceAccountLister
	logger   *slog.Logger

	mu      sync.Mutex
	changed chan struct{}
}

var _ trustpolicy.LabelSource = (*ServiceAccountLabels)(nil)

// NewServiceAccountLabels builds the informer on client; Run starts it.
// logger may be nil.
func NewServiceAccountLabels(client kubernetes.Interface, logger *slog.Logger) (*ServiceAccountLabels, error) {
	if client == nil {
		return nil, errors.New("policycrd: service account labels: a Kubernetes client is required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	inf := corev1informers.NewServiceAccountInformer(client, metav1.NamespaceAll, 0, cache.Indexers{})
	if err := inf.SetTransform(trimToLabels); err != nil {
		return nil, fmt.Errorf("policycrd: service account labels: %w", err)
	}
	s := &ServiceAccountLabels{informer: inf, lister: corev1listers.NewServiceAccountLister(inf.GetIndexer()), logger: logger, changed: make(chan struct{})}
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		if !inf.HasSynced() {
			s.logger.Warn("cannot list service accounts: trust policy rules that select workloads by label match nothing until it works (RBAC: list, watch serviceaccounts)",
				logattr.Error, err)
		}
	}); err != nil {
		return nil, fmt.Errorf("policycrd: service account labels: %w", err)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		// A new account turns unknown labels (nil) into known ones, even
		// none, which a DoesNotExist selector matches.
		AddFunc: func(any) { s.wake() },
		UpdateFunc: func(old, cur any) {
			if labelsChanged(old, cur) {
				s.wake()
			}
		},
		DeleteFunc: func(any) { s.wake() },
	}); err != nil {
		return nil, fmt.Errorf("policycrd: service account labels: %w", err)
	}
	return s, nil
}

// labelsChanged: a resync, or an edit of anything but the labels, wakes
// nobody.
func labelsChanged(old, cur any) bool {
	o, ok1 := old.(*corev1.ServiceAccount)
	c, ok2 := cur.(*corev1.ServiceAccount)
	return !ok1 || !ok2 || !maps.Equal(o.Labels, c.Labels)
}

// trimToLabels keeps what Labels reads.
func trimToLabels(obj any) (any, error) {
	sa, ok := obj.(*corev1.ServiceAccount)
	if !ok {
		return obj, nil // a tombstone: the informer handles it
	}
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
		Name: sa.Name, Namespace: sa.Namespace, ResourceVersion: sa.ResourceVersion, Labels: sa.Labels,
	}}, nil
}

func (s *ServiceAccountLabels) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.changed)
	s.changed = make(chan struct{})
}

// Run watches service accounts until ctx is done; it returns nil then.
func (s *ServiceAccountLabels) Run(ctx context.Context) error {
	s.informer.RunWithContext(ctx)
	return nil
}

// HasSynced reports whether every service account has been listed once.
func (s *ServiceAccountLabels) HasSynced() bool { return s.informer.HasSynced() }

// Labels returns the labels of service account namespace/name (an empty
// map for one without labels), or nil when it is unknown: not listed yet,
// or no such account. The map is the caller's.
//
// It does not wait for the first list: an account found is known, and
// one not yet listed is unknown, which Changed reports when it ends.
func (s *ServiceAccountLabels) Labels(namespace, name string) map[string]string {
	if namespace == "" || name == "" {
		return nil
	}
	sa, err := s.lister.ServiceAccounts(namespace).Get(name)
	if err != nil {
		return nil
	}
	out := maps.Clone(sa.Labels)
	if out == nil {
		out = map[string]string{}
	}
	return out
}

// Changed returns a channel closed when any service account is added,
// deleted or relabelled; a resync without changes does not close it.
func (s *ServiceAccountLabels) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}
