package distribution

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultName is the name of the distributed ConfigMap (--root-configmap).
const DefaultName = "trustbridge-ca-root-cert"

// The label that marks a ConfigMap as trustbridge's. Only ConfigMaps that
// carry it are ever updated or deleted; removing it hands the ConfigMap
// over to whoever removed it.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "trustbridge"
)

// Defaults applied by New.
const (
	DefaultWorkers = 2
	DefaultResync  = 10 * time.Minute
)

// Writes to one namespace's ConfigMap are paced: defaultWriteBurst at
// once, then one per defaultWriteEvery. A trust store change or a repair
// costs a namespace one write, far below that.
const (
	defaultWriteBurst = 10
	defaultWriteEvery = time.Minute
)

// Source is the trust store as the controller reads it; *trust.Store
// implements it.
type Source interface {
	Snapshot() *trust.Snapshot
	Subscribe() (<-chan struct{}, func())
}

// Config configures a Controller. Client, Store and TrustDomain are
// required.
type Config struct {
	// Client writes the ConfigMaps. It needs the permissions of
	// deploy/rbac: namespaces get/list/watch, and ConfigMaps named Name
	// get/list/watch/create/update/delete in every namespace.
	Client kubernetes.Interface
	// Store supplies the bundles; every published snapshot is rendered
	// once and written to every selected namespace.
	Store Source
	// TrustDomain is the local trust domain, whose roots go to
	// root-cert.pem. Until the store holds its bundle nothing is written.
	TrustDomain spiffeid.TrustDomain
	// Name is the ConfigMap's name (default DefaultName).
	Name string
	// NamespaceSelector picks the namespaces (default: all).
	NamespaceSelector labels.Selector
	// Logger receives the controller's logs (nil: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: a private registry).
	Registerer prometheus.Registerer
	// Workers is the number of namespaces reconciled in parallel
	// (default DefaultWorkers).
	Workers int
	// Resync is how often every namespace is reconciled again even without
	// a change, as a safety net (default DefaultResync).
	Resync time.Duration
	// Clock stamps trustbridge_distribution_last_sync_timestamp_seconds
	// (default the real clock).
	Clock clock.PassiveClock
}

// Controller keeps the trust ConfigMap in every selected namespace equal
// to the rendering of the current trust store snapshot. Run it only while
// holding leadership: it has no fence of its own, and followers must not
// run it at all.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	running atomic.Bool
	run     atomic.Pointer[runState]
	// writeBurst and writeEvery pace writes to one namespace; see pacer.
	writeBurst int
	writeEvery time.Duration
}

// runState is what one Run owns: informers, caches, the queue and the
// current rendering. A later Run (a new leadership term) starts afresh.
type runState struct {
	nsLister corelisters.NamespaceLister
	cmLister corelisters.ConfigMapLister
	queue    workqueue.TypedRateLimitingInterface[string]
	pacer    *pacer
	synced   atomic.Bool
	content  atomic.Pointer[content]
	// renderErr is the last rendering failure, nil once one succeeds.
	renderErr atomic.Pointer[error]
}

// content is one rendering, and the store generation it came from.
type content struct {
	generation uint64
	data       map[string]string
}

// New checks cfg, applies defaults and registers the metrics. It starts
// nothing; call Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil {
		return nil, errors.New("distribution: no Kubernetes client")
	}
	if cfg.Store == nil {
		return nil, errors.New("distribution: no trust store")
	}
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("distribution: no local trust domain")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if errs := validation.IsDNS1123Subdomain(cfg.Name); len(errs) > 0 {
		return nil, fmt.Errorf("distribution: ConfigMap name %q: %s", cfg.Name, strings.Join(errs, "; "))
	}
	if cfg.NamespaceSelector == nil {
		cfg.NamespaceSelector = labels.Everything()
	}
	if cfg.Workers < 0 {
		return nil, fmt.Errorf("distribution: workers must not be negative, got %d", cfg.Workers)
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Resync < 0 {
		return nil, fmt.Errorf("distribution: resync period must not be negative, got %s", cfg.Resync)
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c := &Controller{cfg: cfg, log: log, writeBurst: defaultWriteBurst, writeEvery: defaultWriteEvery}
	m, err := newMetrics(cfg.Registerer, c)
	if err != nil {
		return nil, fmt.Errorf("distribution: register metrics: %w", err)
	}
	c.metrics = m
	return c, nil
}

// Ready reports whether the controller is distributing: nil once Run's
// informer caches have synced and a snapshot holding the local trust
// domain has been rendered. Later rendering failures keep the last good
// content in place and show in logs and in
// trustbridge_distribution_render_errors_total, not here, so that one
// broken federated bundle does not take a replica out of service. Ready
// fails whenever Run is not running, as on every follower: it belongs in
// the readiness of the leader's term only, not of every replica.
func (c *Controller) Ready() error {
	rs := c.run.Load()
	if rs == nil {
		return errors.New("distribution: not running")
	}
	if !rs.synced.Load() {
		return errors.New("distribution: informer caches not synced yet")
	}
	if rs.content.Load() == nil {
		if p := rs.renderErr.Load(); p != nil {
			return fmt.Errorf("distribution: nothing to distribute: %w", *p)
		}
		return errors.New("distribution: nothing to distribute yet")
	}
	return nil
}

// Run watches namespaces, ConfigMaps and the trust store and reconciles
// until ctx is done, then stops every goroutine it started and returns
// nil. Run may be called again after it returns (a new leadership term),
// but not twice at once.
func (c *Controller) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("distribution: already running")
	}
	defer c.running.Store(false)

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	rs := c.newRunState()
	defer func() {
		// In this order: workers block in Get until the queue shuts down.
		cancel()
		rs.queue.ShutDown()
		wg.Wait()
	}()
	// Subscribe before the first read so that no change slips between
	// them.
	changed, unsubscribe := c.cfg.Store.Subscribe()
	defer unsubscribe()
	c.renderCurrent(rs)

	nsInformer, cmInformer, err := c.informers(rs)
	if err != nil {
		return err
	}

	c.run.Store(rs)
	defer c.run.Store(nil)

	wg.Go(func() { nsInformer.RunWithContext(ctx) })
	wg.Go(func() { cmInformer.RunWithContext(ctx) })

	if !cache.WaitForCacheSync(ctx.Done(), nsInformer.HasSynced, cmInformer.HasSynced) {
		return nil // ctx is done
	}
	rs.synced.Store(true)
	c.log.Info("distributing trust ConfigMap", "configmap", c.cfg.Name,
		"namespace_selector", c.cfg.NamespaceSelector.String(), logattr.TrustDomain, c.cfg.TrustDomain.Name())
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.processNext(ctx, rs) {
			}
		})
	}
	c.followStore(ctx, rs, changed)
	return nil
}

// newRunState makes a Run's state: a rate-limited queue of namespaces
// and a fresh pacer. The listers are set by informers.
func (c *Controller) newRunState() *runState {
	return &runState{
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedMaxOfRateLimiter(
				workqueue.NewTypedItemExponentialFailureRateLimiter[string](10*time.Millisecond, time.Minute),
				&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(20), 200)},
			),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "trustbridge_distribution"},
		),
		pacer: newPacer(c.writeBurst, c.writeEvery),
	}
}

// informers makes the namespace and ConfigMap informers, sets rs's
// listers to their caches, and has their events queue the namespace
// they are about. It starts neither.
func (c *Controller) informers(rs *runState) (nsInformer, cmInformer cache.SharedIndexInformer, err error) {
	nsInformer = coreinformers.NewFilteredNamespaceInformer(c.cfg.Client, c.cfg.Resync, cache.Indexers{},
		func(o *metav1.ListOptions) { o.LabelSelector = c.cfg.NamespaceSelector.String() })
	// The field selector keeps the cache to our ConfigMaps, and lets RBAC
	// restrict list and watch to that one name.
	cmInformer = coreinformers.NewFilteredConfigMapInformer(c.cfg.Client, metav1.NamespaceAll, c.cfg.Resync,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.cfg.Name).String()
		})
	rs.nsLister = corelisters.NewNamespaceLister(nsInformer.GetIndexer())
	rs.cmLister = corelisters.NewConfigMapLister(cmInformer.GetIndexer())

	// A namespace that stops matching the selector arrives as a delete:
	// the API server's filtered watch reports it gone.
	if _, err := nsInformer.AddEventHandler(c.enqueueHandler(rs)); err != nil {
		return nil, nil, fmt.Errorf("distribution: namespace informer: %w", err)
	}
	if _, err := cmInformer.AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: c.isOurName,
		Handler:    c.enqueueHandler(rs),
	}); err != nil {
		return nil, nil, fmt.Errorf("distribution: ConfigMap informer: %w", err)
	}
	return nsInformer, cmInformer, nil
}

// enqueueHandler queues the namespace of every added, updated or deleted
// object.
func (c *Controller) enqueueHandler(rs *runState) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueObject(rs, obj) },
		UpdateFunc: func(_, obj any) { c.enqueueObject(rs, obj) },
		DeleteFunc: func(obj any) { c.enqueueObject(rs, obj) },
	}
}

// followStore renders every trust store change and, when the content
// changed, queues every namespace, until ctx is done. A closed changed
// channel only waits for ctx.
func (c *Controller) followStore(ctx context.Context, rs *runState, changed <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-changed:
			if !ok {
				<-ctx.Done()
				return
			}
			if c.renderCurrent(rs) {
				c.enqueueAll(rs)
			}
		}
	}
}

// renderCurrent renders the store's current snapshot, once per
// generation, and reports whether the content changed. On failure the
// last good content stays.
func (c *Controller) renderCurrent(rs *runState) bool {
	sn := c.cfg.Store.Snapshot()
	cur := rs.content.Load()
	if cur != nil && cur.generation == sn.Generation() {
		return false
	}
	data, skips, err := render(sn, c.cfg.TrustDomain, maxConfigMapBytes)
	if err != nil {
		rs.renderErr.Store(&err)
		c.metrics.renderErrors.Inc()
		c.log.Error("cannot render trust ConfigMap; keeping the last good content",
			"generation", sn.Generation(), logattr.TrustDomain, c.cfg.TrustDomain.Name(), logattr.Error, err)
		return false
	}
	rs.renderErr.Store(nil)
	for _, s := range skips {
		c.metrics.skipped.WithLabelValues(s.trustDomain, s.reason).Inc()
		c.log.Warn("federated trust domain left out of the trust ConfigMap",
			logattr.TrustDomain, s.trustDomain, "reason", s.reason, logattr.Error, s.err)
	}
	rs.content.Store(&content{generation: sn.Generation(), data: data})
	return cur == nil || !maps.Equal(cur.data, data)
}

func (c *Controller) isOurName(obj any) bool {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := metaOf(obj)
	return err == nil && m.GetName() == c.cfg.Name
}

// enqueueObject queues the namespace a Namespace or ConfigMap event is
// about.
func (c *Controller) enqueueObject(rs *runState, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := metaOf(obj)
	if err != nil {
		c.log.Warn("unexpected informer object", logattr.Error, err)
		return
	}
	ns := m.GetNamespace()
	if _, isNamespace := obj.(*corev1.Namespace); isNamespace {
		ns = m.GetName()
	}
	if ns != "" {
		rs.queue.Add(ns)
	}
}

func metaOf(obj any) (metav1.Object, error) {
	switch o := obj.(type) {
	case *corev1.Namespace:
		return o, nil
	case *corev1.ConfigMap:
		return o, nil
	default:
		return nil, fmt.Errorf("object of type %T", obj)
	}
}

// enqueueAll queues every namespace the caches know: selected ones for an
// update, and those holding one of our ConfigMaps (which may need
// deleting).
func (c *Controller) enqueueAll(rs *runState) {
	namespaces, _ := rs.nsLister.List(labels.Everything())
	for _, ns := range namespaces {
		rs.queue.Add(ns.Name)
	}
	cms, _ := rs.cmLister.List(labels.Everything())
	for _, cm := range cms {
		rs.queue.Add(cm.Namespace)
	}
}

func (c *Controller) processNext(ctx context.Context, rs *runState) bool {
	ns, quit := rs.queue.Get()
	if quit {
		return false
	}
	defer rs.queue.Done(ns)
	err := c.reconcile(ctx, rs, ns)
	if err == nil {
		rs.queue.Forget(ns)
		return true
	}
	if ctx.Err() != nil {
		return true
	}
	if te := (*throttledError)(nil); errors.As(err, &te) {
		// Not a failure: the write waits for the pacer, whatever events
		// arrive meanwhile.
		c.metrics.throttled.Inc()
		c.log.Warn("trust ConfigMap rewritten too often; postponing the next write", "namespace", ns,
			"configmap", c.cfg.Name, "delay", te.delay, logattr.Error, err)
		rs.queue.Forget(ns)
		rs.queue.AddAfter(ns, te.delay)
		return true
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		// The cache is behind the API server; the retry sees the newer
		// object.
		c.log.Debug("trust ConfigMap changed under us; retrying", "namespace", ns, logattr.Error, err)
	} else {
		c.log.Warn("cannot reconcile trust ConfigMap; retrying with backoff", "namespace", ns,
			"configmap", c.cfg.Name, logattr.Error, err)
	}
	rs.queue.AddRateLimited(ns)
	return true
}

// wanted reports whether namespace ns should hold our ConfigMap, and
// whether it is terminating (then nothing is done either way: the
// namespace's deletion removes the ConfigMap).
func (c *Controller) wanted(rs *runState, ns string) (want, terminating bool, err error) {
	obj, err := rs.nsLister.Get(ns)
	if apierrors.IsNotFound(err) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	if obj.DeletionTimestamp != nil {
		return false, true, nil
	}
	// The informer already filters by the selector; check again so that
	// the decision never rests on the server having applied it.
	return c.cfg.NamespaceSelector.Matches(labels.Set(obj.Labels)), false, nil
}

func owned(cm *corev1.ConfigMap) bool {
	return cm.Labels[ManagedByLabel] == ManagedByValue
}

// upToDate reports whether cm, which we own, holds exactly data.
func upToDate(cm *corev1.ConfigMap, data map[string]string) bool {
	return len(cm.BinaryData) == 0 && maps.Equal(cm.Data, data)
}

// reconcile brings namespace ns to its desired state from the caches. A
// namespace that no longer matches the selector loses our ConfigMap:
// trust left behind would never be rotated again, and a root revoked later
// would stay trusted there. A ConfigMap we do not own is never touched.
func (c *Controller) reconcile(ctx context.Context, rs *runState, ns string) error {
	want, terminating, err := c.wanted(rs, ns)
	if err != nil || terminating {
		return err
	}
	cm, err := rs.cmLister.ConfigMaps(ns).Get(c.cfg.Name)
	if apierrors.IsNotFound(err) {
		cm, err = nil, nil
	}
	if err != nil {
		return err
	}
	cms := c.cfg.Client.CoreV1().ConfigMaps(ns)

	if !want {
		if cm == nil || !owned(cm) {
			return nil
		}
		if err := c.pace(rs, ns); err != nil {
			return err
		}
		return c.delete(ctx, rs, cms, cm, "namespace no longer selected")
	}
	return c.distribute(ctx, rs, cms, ns, cm)
}

// distribute brings the ConfigMap of selected namespace ns, cm as cached
// (nil if there is none), to the current rendering: it creates it,
// updates it, or replaces it when it is immutable. Writes are paced; a
// ConfigMap we do not own is left alone.
func (c *Controller) distribute(ctx context.Context, rs *runState, cms typedcorev1.ConfigMapInterface, ns string, cm *corev1.ConfigMap) error {
	cur := rs.content.Load()
	if cur == nil {
		return nil // nothing rendered yet; the first rendering queues every namespace
	}
	if cm == nil || (owned(cm) && !upToDate(cm, cur.data)) { // a write below
		if err := c.pace(rs, ns); err != nil {
			return err
		}
	}
	switch {
	case cm == nil:
		if err := c.create(ctx, rs, cms, ns, cur); err != nil {
			return err
		}
	case !owned(cm):
		c.metrics.foreign.Inc()
		c.log.Warn("a ConfigMap with the trust ConfigMap's name exists but is not managed by trustbridge; leaving it alone",
			"namespace", ns, "configmap", c.cfg.Name, "label", ManagedByLabel+"="+ManagedByValue)
		return nil
	case upToDate(cm, cur.data):
	case cm.Immutable != nil && *cm.Immutable:
		// Someone made our ConfigMap immutable; it cannot be updated, only
		// replaced. Its deletion event brings the namespace back here.
		return c.delete(ctx, rs, cms, cm, "immutable and out of date; recreating it")
	default:
		if err := c.update(ctx, rs, cms, ns, cm, cur); err != nil {
			return err
		}
	}
	c.metrics.lastSync.Set(float64(c.cfg.Clock.Now().UnixNano()) / 1e9)
	return nil
}

// create writes our ConfigMap, holding cur, into namespace ns.
func (c *Controller) create(ctx context.Context, rs *runState, cms typedcorev1.ConfigMapInterface, ns string, cur *content) error {
	_, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      c.cfg.Name,
			Namespace: ns,
			Labels:    map[string]string{ManagedByLabel: ManagedByValue},
		},
		Data: maps.Clone(cur.data),
	}, metav1.CreateOptions{})
	if err != nil {
		return c.writeFailed(err)
	}
	rs.pacer.wrote(ns, c.cfg.Clock.Now())
	c.metrics.writes.WithLabelValues(resultCreated).Inc()
	c.log.Info("created trust ConfigMap", "namespace", ns, "configmap", c.cfg.Name, "generation", cur.generation)
	return nil
}

// update replaces the data of our ConfigMap cm in namespace ns with cur.
func (c *Controller) update(ctx context.Context, rs *runState, cms typedcorev1.ConfigMapInterface, ns string, cm *corev1.ConfigMap, cur *content) error {
	next := cm.DeepCopy()
	next.Data = maps.Clone(cur.data)
	next.BinaryData = nil
	// next carries the cached resourceVersion: a concurrent change
	// fails with a conflict and is retried from the newer object.
	if _, err := cms.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		return c.writeFailed(err)
	}
	rs.pacer.wrote(ns, c.cfg.Clock.Now())
	c.metrics.writes.WithLabelValues(resultUpdated).Inc()
	c.log.Info("updated trust ConfigMap", "namespace", ns, "configmap", c.cfg.Name, "generation", cur.generation)
	return nil
}

// pace returns a *throttledError when ns must wait for its next write.
func (c *Controller) pace(rs *runState, ns string) error {
	if d := rs.pacer.wait(ns, c.cfg.Clock.Now()); d > 0 {
		return &throttledError{delay: d}
	}
	return nil
}

func (c *Controller) delete(ctx context.Context, rs *runState, cms interface {
	Delete(context.Context, string, metav1.DeleteOptions) error
}, cm *corev1.ConfigMap, why string) error {
	uid, rv := cm.UID, cm.ResourceVersion
	err := cms.Delete(ctx, cm.Name, metav1.DeleteOptions{
		// Delete exactly what we judged: not a newer version someone
		// wrote (perhaps without our label) since.
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return c.writeFailed(err)
	}
	rs.pacer.wrote(cm.Namespace, c.cfg.Clock.Now())
	c.metrics.writes.WithLabelValues(resultDeleted).Inc()
	c.metrics.lastSync.Set(float64(c.cfg.Clock.Now().UnixNano()) / 1e9)
	c.log.Info("deleted trust ConfigMap", "namespace", cm.Namespace, "configmap", cm.Name, "reason", why)
	return nil
}

func (c *Controller) writeFailed(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		c.metrics.writes.WithLabelValues(resultConflict).Inc()
	} else {
		c.metrics.writes.WithLabelValues(resultError).Inc()
	}
	return err
}
